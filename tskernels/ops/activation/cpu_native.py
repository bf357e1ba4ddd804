"""CPU backend "cpu_native" of the activation family: SiLU-and-mul in C++ (tskernels/csrc/
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


if _cpu is not None:
    @register("activation", "silu_and_mul", formats={"x": _F}, **CPU_NATIVE)
    def silu_and_mul(x, out=None):
        """silu(gate) * up in C++ (fp32 math; bf16 rounded once)."""
        if x.dtype == torch.bfloat16:
            y = silu_and_mul(x.float()).to(torch.bfloat16)
            return y if out is None else out.copy_(y)
        x2 = _rows(x)
        inter = x.shape[-1] // 2
        y = torch.empty(*x.shape[:-1], inter, dtype=x.dtype)
        y2 = y.view(-1, inter)
        _cpu.silu_and_mul_f32(x2.data_ptr(), x2.stride(0), y2.data_ptr(), inter,
                              x2.shape[0], inter)
        if out is None:
            return y
        out.copy_(y)
        return out
