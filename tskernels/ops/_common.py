"""Pieces shared by every op family's backends."""
from __future__ import annotations

import importlib
import pkgutil

import torch

from ..registry import ALL_TARGETS, ANY_DEVICE, TRITON_GPU, Capability

# Registration keywords of a reference backend: runs wherever torch runs, lowest band.
REF = dict(backend="reference", capability=ANY_DEVICE, band="reference",
           tags=("deterministic",), run_verified=("cpu",))

# Registration keywords of a portable Triton backend: every Triton target is in the compile
# matrix (Ampere sm_80 / sm_86 too: the kernels' bf16 / fp16 cases build with mma.sync; their
# fp8 cases are not built there, see tskernels.compile.NO_E4M3), the interpreter tier runs it
# on CPU; run verification comes from verified.json.
TRITON_TARGETS = ("sm_80", "sm_86", *ALL_TARGETS)
TRITON = dict(backend="triton", capability=TRITON_GPU, band="portable", compiled=TRITON_TARGETS,
              interpreter=True)


CPU_ONLY = Capability(vendors=frozenset({"cpu"}))

# Registration keywords of the C++ CPU backends ("cpu_native" in norm / activation / rope): opt-in
# (never auto-selected: they sum in another order than the reference), run-verified on the CPU.
CPU_NATIVE = dict(backend="cpu_native", capability=CPU_ONLY, band="portable",
                  run_verified=("cpu",), opt_in=True, tags=("deterministic",))


def cpu_extension():
    """The compiled `tskernels._cpu` module, or None in a source checkout without it."""
    try:
        from .. import _cpu
    except ImportError:
        return None
    return _cpu


def rows(x: torch.Tensor) -> torch.Tensor:
    """x as a 2-D [rows, last dim] view with unit last stride (a copy only when needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """Write `y` into the caller's buffer when one was given."""
    if out is None:
        return y
    out.copy_(y)
    return out


def rope_result(q, k, qo, ko, inplace: bool):
    """apply_rope's return convention: (qo, ko), or written back into q and k when inplace."""
    if not inplace:
        return qo, ko
    q.copy_(qo)
    if k is not None:
        k.copy_(ko)
    return q, k


def load_backends(package: str, path) -> list[str]:
    """Import every backend module of a family folder (each registers itself with
    `@register`): the modules whose name does not start with "_". A family's `__init__` calls
    `load_backends(__name__, __path__)`, so a new backend is one new file."""
    names = sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
