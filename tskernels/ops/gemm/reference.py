"""Reference backend of the gemm family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.gemm as ref

from ...registry import register
from .._common import REF


@register("gemm", "mm", **REF)
def mm(a, b, *, out_dtype=None):
    return ref.mm(a, b, out_dtype=out_dtype)


@register("gemm", "gemv", **REF, traits={"residual": (False, True)})
def gemv(a, b, *, out_dtype=None, residual=None):
    return ref.gemv(a, b, out_dtype=out_dtype, residual=residual)


@register("gemm", "fp8_block_mm", **REF)
def fp8_block_mm(a, a_scale, b, b_scale, *, out_dtype, block):
    return ref.fp8_block_mm(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block)


@register("gemm", "quantize_fp8_per_token_group", **REF)
def quantize_fp8_per_token_group(x, group, *, eps):
    return ref.quantize_fp8_per_token_group(x, group, eps=eps)


@register("gemm", "silu_and_mul_quantize_fp8", **REF)
def silu_and_mul_quantize_fp8(x, group, *, eps):
    return ref.silu_and_mul_quantize_fp8(x, group, eps=eps)


@register("gemm", "quantize_fp8_per_channel", **REF)
def quantize_fp8_per_channel(x, *, eps):
    return ref.quantize_fp8_per_channel(x, eps=eps)


@register("gemm", "quantize_fp8_per_tensor", **REF)
def quantize_fp8_per_tensor(x, scale, *, eps):
    return ref.quantize_fp8_per_tensor(x, scale, eps=eps)


@register("gemm", "rmsnorm_gemv", **REF, traits={"residual": (False, True)})
def rmsnorm_gemv(x, norm_weight, b, *, eps, out_dtype=None, residual=None):
    return ref.rmsnorm_gemv(x, norm_weight, b, eps=eps, out_dtype=out_dtype, residual=residual)


@register("gemm", "silu_mul_gemv", **REF, traits={"residual": (False, True)})
def silu_mul_gemv(x, b, *, out_dtype=None, residual=None):
    return ref.silu_mul_gemv(x, b, out_dtype=out_dtype, residual=residual)
