"""CPU backend "cpu_native" of the norm family: RMSNorm (+ fused residual add) in C++ (tskernels/csrc/
cpu_elementwise.cpp, compiled into `tskernels._cpu`), fp32 math for fp32 and bf16 tensors (bf16
is widened, computed in fp32 and rounded once, as the references do).

A CPU decode step makes ~150 of these calls on tiny rows; the references spend most of their
time in dtype round trips and a dozen small tensor ops each. Same math as tskernels_ref (fp32
throughout, different summation order). CPU only, opt-in (never auto-selected: on a CPU the
reference is the default); serve's kernel policy prefers it for fp32 / bf16 models.
Run-verified on the CPU by tests/kernels/test_cpu_native.py. Without the built extension
nothing registers.
"""
from __future__ import annotations

import torch

from ...registry import register
from .._common import CPU_NATIVE, cpu_extension, rows as _rows

_cpu = cpu_extension()
_F = ("fp32", "bf16")


def _norm(x, residual, weight, eps):
    if x.dtype == torch.bfloat16:
        # bf16: as the reference, the residual sum is rounded to bf16 before it is normalized;
        # the norm runs in fp32 and the result is rounded once
        new_res = None
        if residual is not None:
            new_res = (x.float() + residual.float()).to(torch.bfloat16)
            x = new_res
        y, _ = _norm(x.float(), None, weight.float(), eps)
        return y.to(torch.bfloat16), new_res
    n = x.shape[-1]
    x2 = _rows(x)
    w = weight.to(torch.float32).contiguous()
    y = torch.empty(x.shape, dtype=x.dtype)
    y2 = y.view(-1, n)
    if residual is None:
        _cpu.rmsnorm_f32(x2.data_ptr(), x2.stride(0), 0, 0, w.data_ptr(), float(eps),
                         y2.data_ptr(), n, 0, x2.shape[0], n)
        return y, None
    r2 = _rows(residual)
    new_res = torch.empty(x.shape, dtype=x.dtype)
    _cpu.rmsnorm_f32(x2.data_ptr(), x2.stride(0), r2.data_ptr(), r2.stride(0), w.data_ptr(),
                     float(eps), y2.data_ptr(), n, new_res.data_ptr(), x2.shape[0], n)
    return y, new_res


if _cpu is not None:
    @register("norm", "rmsnorm", formats={"x": _F, "weight": _F}, **CPU_NATIVE)
    def rmsnorm(x, weight, eps, out=None):
        """fp32 RMSNorm in C++."""
        y, _ = _norm(x, None, weight, eps)
        if out is None:
            return y
        out.copy_(y)
        return out

    @register("norm", "fused_add_rmsnorm", formats={"x": _F, "weight": _F}, **CPU_NATIVE)
    def fused_add_rmsnorm(x, residual, weight, eps):
        """fp32 residual add + RMSNorm in C++; returns (y, x + residual)."""
        return _norm(x, residual, weight, eps)
