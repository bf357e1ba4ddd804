"""CPU backend of gemm.mm ("torch_cpu"): torch.mm in the operands' own dtype.

bf16/fp16 GEMMs run natively (oneDNN, fp32 accumulation) instead of the reference's upcast of
both operands to fp32 on every call; fp32 is the same math as the reference. Opt-in: it rounds
bf16 differently from the reference, so it runs only when named.
"""
from __future__ import annotations

import torch

from ...registry import register
from ..attention.torch_cpu import CPU_ONLY

_FORMATS = ("fp32", "bf16", "fp16")


@register("gemm", "mm", backend="torch_cpu", capability=CPU_ONLY, band="portable",
          run_verified=("cpu",), opt_in=True, tags=("deterministic",),
          formats={"a": _FORMATS, "b": _FORMATS, "c": _FORMATS + ("fp64",)})
def mm(a, b, *, out_dtype=None):
    """c = a @ b.T with torch.mm in a's dtype."""
    c = torch.mm(a, b.t())
    return c if out_dtype is None or out_dtype == c.dtype else c.to(out_dtype)
