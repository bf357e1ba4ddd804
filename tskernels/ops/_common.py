"""Pieces shared by every op family's backends."""
from __future__ import annotations

import importlib
import pkgutil

import torch

from ..registry import ALL_TARGETS, ANY_DEVICE, TRITON_GPU

# Registration keywords of a reference backend: runs wherever torch runs, lowest band.
REF = dict(backend="reference", capability=ANY_DEVICE, band="reference",
           tags=("deterministic",), run_verified=("cpu",))

# Registration keywords of a portable Triton backend: every Triton target is in the compile
# matrix, the interpreter tier runs it on CPU; run verification comes from verified.json.
TRITON = dict(backend="triton", capability=TRITON_GPU, band="portable", compiled=ALL_TARGETS,
              interpreter=True)


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
