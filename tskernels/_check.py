"""Argument validation at the public boundary: every message names the argument and what was
expected, so bad input gets a clear error rather than a crash inside a kernel."""
from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

FLOAT = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_OR_FP64 = FLOAT + (torch.float64,)
FP8 = (torch.float8_e4m3fn,)
INDEX = (torch.int32, torch.int64)


def _dt(dtypes: Collection[torch.dtype]) -> str:
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(name: str, t, *, ndim: int | Sequence[int] | None = None,
           dtypes: Collection[torch.dtype] | None = None,
           shape: Sequence[int | None] | None = None,
           device: torch.device | None = None, contiguous_last: bool = False) -> torch.Tensor:
    """Check one tensor argument; returns it. shape entries of None match any size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(f"{name}: expected {' or '.join(map(str, allowed))} dimensions, "
                             f"got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dt(dtypes)}, got {t.dtype}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != a for s, a in zip(shape, t.shape)):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")
    if contiguous_last and t.dim() and t.shape[-1] > 1 and t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), "
                         f"got strides {t.stride()}")
    return t


def optional(name: str, t, **kw) -> torch.Tensor | None:
    return None if t is None else tensor(name, t, **kw)


def same_device(**tensors: torch.Tensor | None) -> torch.device:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    uniq = set(devs.values())
    if len(uniq) > 1:
        raise ValueError(f"all tensors must be on one device, got {devs}")
    return next(iter(uniq))


def positive(name: str, value, *, allow_zero: bool = False):
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ValueError(f"{name}: expected a {'non-negative' if allow_zero else 'positive'} "
                         f"value, got {value}")
    return value


def one_of(name: str, value, allowed: Collection):
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {sorted(allowed)}, got {value!r}")
    return value


def divisible(name: str, value: int, by: int, what: str):
    if by <= 0 or value % by:
        raise ValueError(f"{name}: {value} must be a multiple of {what} ({by})")
    return value
