"""Tensor descriptors built inside a Triton kernel (tl.make_tensor_descriptor) need a small
global scratch from Triton's allocator hook, a context variable: `ensure_allocator` sets one
(torch's caching allocator, so CUDA-graph capture is safe) where none is set, per thread."""
from __future__ import annotations

import torch
import triton


def ensure_allocator() -> None:
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=dev)


def rows_ok(*tensors: torch.Tensor) -> bool:
    """Every tensor's base and row stride 16-byte aligned, unit last stride (a descriptor's
    requirements), on the interpreter (CPU) or an NVIDIA device with TMA (sm_90+)."""
    t0 = tensors[0]
    if t0.device.type == "cuda":
        if torch.version.hip is not None or torch.cuda.get_device_capability(t0.device)[0] < 9:
            return False
    elif t0.device.type != "cpu":
        return False
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0
               and (t.stride(-2) * t.element_size()) % 16 == 0 for t in tensors)
