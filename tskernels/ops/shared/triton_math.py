"""Triton helpers shared by several backends: exp2-based tanh, e4m3 -> fp16 conversion, the
fp8 dequant scales of one KV head, and the exact e4m3 rounding the interpreter needs.

Backends import these (never each other's private helpers); they are `@triton.jit` device
functions, inlined into the calling kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def safe_tanh(x):
    # Overflow-safe tanh from exp2 (portable: no libdevice), odd-symmetric.
    e = tl.exp2(-2.0 * LOG2E * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def fp8_to_f16(x):
    # e4m3 -> fp16, 4 values per instruction pair. Marked impure so the layout passes cannot
    # sink it below the shared-memory stage: fp16 (not fp8) reaches shared memory and the PV
    # dot's transposed B operand comes from ldmatrix.trans instead of byte-wise shared loads
    # (sm_90 has no 8-bit ldmatrix.trans). NVIDIA only (PTX); not in the interpreter.
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
        "cvt.rn.f16x2.e4m3x2 $1, hi; }", "=r,=r,r", [x.to(tl.int8, bitcast=True)],
        dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def kv_scales(ks_ptr, vs_ptr, kvh, sm_scale, SCALED: tl.constexpr, PER_HEAD: tl.constexpr):
    """(softmax scale with K's dequant scale folded in, V's dequant scale) for KV head kvh."""
    qk_scale = sm_scale
    v_scale = 1.0
    if SCALED:
        if PER_HEAD:
            qk_scale *= tl.load(ks_ptr + kvh)
            v_scale = tl.load(vs_ptr + kvh)
        else:
            qk_scale *= tl.load(ks_ptr)
            v_scale = tl.load(vs_ptr)
    return qk_scale, v_scale


@triton.jit
def round_to_e4m3_grid(x):
    """Round fp32 `x` (already clamped to +-448) to the nearest e4m3 value, ties to even, in
    fp32 arithmetic, so the final cast is exact. Used only under TRITON_INTERPRET=1, whose
    fp32 -> e4m3 cast drops the carry when rounding crosses a power of two (-125.4 -> -64)."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # e4m3 subnormals share the step of the smallest normal binade
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    y = x / step
    f = tl.floor(y)
    d = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    up = (d > 0.5) | ((d == 0.5) & odd)
    return tl.where(up, f + 1.0, f) * step
