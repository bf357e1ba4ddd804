"""gemm.mm through torch.mm in the operands' own dtype ("torch_native": MKL/oneDNN on the CPU,
cuBLAS/hipBLASLt on GPUs).

bf16/fp16 GEMMs run natively with fp32 accumulation instead of the reference's upcast of both
operands to fp32 on every call. Opt-in (never auto-selected): it rounds 16-bit results
differently from the reference, so engines name it, as serve's model runner does. Run-verified
on the CPU by tests/kernels/test_gemm_native.py; on GPUs once its GPU-tier test has passed.
"""
from __future__ import annotations

import torch

from ...registry import register

_FORMATS = ("fp32", "bf16", "fp16")
BACKEND = "torch_native"


@register("gemm", "mm", backend=BACKEND, band="portable", run_verified=("cpu",), opt_in=True,
          tags=("deterministic",),
          formats={"a": _FORMATS, "b": _FORMATS, "c": _FORMATS + ("fp64",)})
def mm(a, b, *, out_dtype=None):
    """c = a @ b.T with torch.mm in a's dtype."""
    c = torch.mm(a, b.t())
    return c if out_dtype is None or out_dtype == c.dtype else c.to(out_dtype)
