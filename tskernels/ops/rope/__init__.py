"""Rotary position embedding (neox / gptj pairing, partial rotary, scaled frequencies)."""
from __future__ import annotations

import torch
import tskernels_ref.rope as _ref

from ... import _check
from ...registry import fmt, select
from .._common import load_backends

BACKENDS = load_backends(__name__, __path__)

STYLES = ("neox", "gptj")


def cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *,
                  scaling: dict | None = None, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """[max_position, rotary_dim] table: first half cos(p * f_i), second half sin(p * f_i),
    f_i = base^(-2i/rotary_dim), with optional "linear" or "llama3" scaling. Built once per
    model (float64 math), so it has no kernel."""
    _check.positive("max_position", max_position)
    _check.positive("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be even, got {rotary_dim}")
    return _ref.cos_sin_cache(max_position, rotary_dim, base, scaling=scaling,
                              dtype=dtype).to(device)


def apply_rope(q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor, *, style: str = "neox", inplace: bool = False,
               backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate the first r = cos_sin_cache.shape[1] dims of every head by the token's position.

    q: [T, Hq, D], k: [T, Hk, D] or None (fp32/fp16/bf16, last dim contiguous, r <= D).
    positions: int32/int64 [T], each in [0, cos_sin_cache.shape[0]). cos_sin_cache: fp32
    [max_position, r] from `cos_sin_cache`. style: "neox" pairs (i, i + r/2), "gptj" pairs
    (2i, 2i + 1). inplace=True rotates q and k in their own storage. Returns (q_out, k_out).
    """
    _check.one_of("style", style, STYLES)
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    T = q.shape[0]
    if k is not None:
        _check.tensor("k", k, ndim=3, dtypes=(q.dtype,), shape=(T, None, q.shape[2]),
                      device=q.device, contiguous_last=True)
    _check.tensor("positions", positions, ndim=1, dtypes=_check.INDEX, shape=(T,),
                  device=q.device)
    _check.tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=(torch.float32, torch.float64),
                  device=q.device)
    r = cos_sin_cache.shape[1]
    if r % 2 or r > q.shape[2]:
        raise ValueError(f"cos_sin_cache: width {r} must be even and <= head_dim {q.shape[2]}")
    kern = select("rope", "apply_rope", device=q.device, formats={"q": fmt(q.dtype)},
                  traits={"style": style}, backend=backend)
    return kern(q, k, positions, cos_sin_cache, style=style, inplace=inplace)
