"""CPU backend "cpu_native" of the rope family: rotary embedding (neox / gptj, partial rotary) in C++ (tskernels/csrc/
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
from .._common import CPU_NATIVE, cpu_extension, rope_result

_cpu = cpu_extension()
_F = ("fp32", "bf16")


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
    @register("rope", "apply_rope", formats={"q": _F}, **CPU_NATIVE)
    def apply_rope(q, k, positions, cos_sin_cache, *, style, inplace):
        """fp32 rotary embedding in C++ (neox / gptj, partial rotary)."""
        cache = cos_sin_cache.to(torch.float32).contiguous()
        pos = positions.contiguous()
        neox = style == "neox"
        qo = _rope_one(q, pos, cache, neox)
        ko = None if k is None else _rope_one(k, pos, cache, neox)
        return rope_result(q, k, qo, ko, inplace)
