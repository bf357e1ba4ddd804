"""Reference backend of the gemm family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.gemm as ref

from ...registry import register
from .._common import REF


@register("gemm", "mm", **REF)
def mm(a, b, *, out_dtype=None):
    return ref.mm(a, b, out_dtype=out_dtype)


@register("gemm", "gemv", **REF)
def gemv(a, b, *, out_dtype=None):
    return ref.gemv(a, b, out_dtype=out_dtype)


@register("gemm", "fp8_block_mm", **REF)
def fp8_block_mm(a, a_scale, b, b_scale, *, out_dtype, block):
    return ref.fp8_block_mm(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block)
