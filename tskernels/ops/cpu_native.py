"""CPU backend "cpu_native": RMSNorm (+ fused residual add), SiLU-and-mul and RoPE in C++
(tskernels/csrc/cpu_gemm.cpp, compiled into `tskernels._cpu`), fp32 math for fp32 and bf16
tensors (bf16 is widened, computed in fp32 and rounded once, as the references do).

A CPU decode step makes ~150 of these calls on tiny rows; the references spend most of their
time in dtype round trips and a dozen small tensor ops each. Same math as tskernels_ref (fp32
throughout, different summation order). CPU only, opt-in (never auto-selected: on a CPU the
reference is the default); serve's model runner names it for fp32 / bf16 models. Run-verified
on the CPU by tests/kernels/test_cpu_native.py. Without the built extension nothing registers.
"""
from __future__ import annotations

import torch

from ..registry import Capability, register
from ._common import rope_result

try:
    from .. import _cpu
except ImportError:  # a source checkout without the built extension
    _cpu = None

BACKEND = "cpu_native"
CPU_ONLY = Capability(vendors=frozenset({"cpu"}))


def available() -> bool:
    return _cpu is not None


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


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


def _rope_one(x, positions, cache, neox):
    if x.dtype == torch.bfloat16:
        return _rope_one(x.float(), positions, cache, neox).to(torch.bfloat16)
    t, h, d = x.shape
    out = torch.empty(t, h, d, dtype=x.dtype)
    _cpu.rope_f32(x.data_ptr(), x.stride(0), x.stride(1), out.data_ptr(), t, h, d,
                  positions.data_ptr(), positions.dtype == torch.int64, cache.data_ptr(),
                  cache.shape[0], cache.shape[1], cache.shape[1], neox)
    return out


if _cpu is not None:
    _KW = dict(backend=BACKEND, capability=CPU_ONLY, band="portable", run_verified=("cpu",),
               opt_in=True, tags=("deterministic",))

    _F = ("fp32", "bf16")

    @register("norm", "rmsnorm", formats={"x": _F, "weight": _F}, **_KW)
    def rmsnorm(x, weight, eps, out=None):
        """fp32 RMSNorm in C++."""
        y, _ = _norm(x, None, weight, eps)
        if out is None:
            return y
        out.copy_(y)
        return out

    @register("norm", "fused_add_rmsnorm", formats={"x": _F, "weight": _F}, **_KW)
    def fused_add_rmsnorm(x, residual, weight, eps):
        """fp32 residual add + RMSNorm in C++; returns (y, x + residual)."""
        return _norm(x, residual, weight, eps)

    @register("activation", "silu_and_mul", formats={"x": _F}, **_KW)
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

    @register("rope", "apply_rope", formats={"q": _F}, **_KW)
    def apply_rope(q, k, positions, cos_sin_cache, *, style, inplace):
        """fp32 rotary embedding in C++ (neox / gptj, partial rotary)."""
        cache = cos_sin_cache.to(torch.float32).contiguous()
        pos = positions.contiguous()
        neox = style == "neox"
        qo = _rope_one(q, pos, cache, neox)
        ko = None if k is None else _rope_one(k, pos, cache, neox)
        return rope_result(q, k, qo, ko, inplace)
