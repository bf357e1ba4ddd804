"""Triton backends of the block-fp8 GEMM and the fp8 quantizers (registration and dispatch).

fp8_block_mm (DeepSeek-V3 layout: 1 x 128 activation groups, 128 x 128 weight blocks):
M <= 64 rows stream the weight through the split-K kernel of triton_gemv (decode: bound by
the fp8 weight bytes), larger M run the persistent block-scaled kernel of triton_mm. The
quantizers' kernels live in triton_quant.
"""
from __future__ import annotations

import torch

from ...registry import register
from .._common import TRITON
from . import triton_gemv, triton_mm, triton_quant

FP8_BLOCK = 128
# every Triton target (on gfx942, whose own fp8 is the fnuz variant, Triton converts OCP e4m3)
_KW = {**TRITON, "band": "performant"}
_KW_QUANT = {**TRITON, "tags": ("deterministic",)}
_IN = ("fp32", "fp16", "bf16")


def _unit_k(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@register("gemm", "fp8_block_mm", **_KW,
          formats={"a": ("fp8_e4m3",), "b": ("fp8_e4m3",), "c": ("bf16", "fp16", "fp32")},
          traits={"block": (FP8_BLOCK,)},
          compile_cases=lambda: (triton_gemv.compile_cases(True)
                                 + triton_mm.compile_cases(True)))
def fp8_block_mm(a, a_scale, b, b_scale, *, out_dtype, block):
    """Triton block-fp8 GEMM: weight streaming (split-K) for M <= 64, persistent tiles above."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    a, b = _unit_k(a), _unit_k(b)
    a_scale, b_scale = a_scale.float(), b_scale.float()
    if m <= triton_gemv.MAX_M:
        return triton_gemv.stream_mm(a, b, out, x_scale=a_scale, w_scale=b_scale, block=block)
    return triton_mm.persistent_mm(a, b, out, a_scale=a_scale, b_scale=b_scale, block=block)


def _group_ok(g) -> bool:
    return isinstance(g, int) and 16 <= g <= 4096 and g & (g - 1) == 0


@register("gemm", "quantize_fp8_per_token_group", **_KW_QUANT, formats={"x": _IN},
          traits={"group": _group_ok},
          compile_cases=lambda: triton_quant.compile_cases("group"))
def quantize_fp8_per_token_group(x, group, *, eps):
    """Triton per-token-group fp8 quantization (one program: 16 rows x one group)."""
    return triton_quant.group_quant(_unit_k(x), group, eps)


@register("gemm", "silu_and_mul_quantize_fp8", **_KW_QUANT, formats={"x": _IN},
          traits={"group": _group_ok},
          compile_cases=lambda: triton_quant.compile_cases("silu"))
def silu_and_mul_quantize_fp8(x, group, *, eps):
    """Triton SiLU-and-mul fused with per-token-group fp8 quantization (fp32 in between)."""
    return triton_quant.group_quant(_unit_k(x), group, eps, silu_mul=True)


@register("gemm", "quantize_fp8_per_channel", **_KW_QUANT, formats={"x": _IN},
          compile_cases=lambda: triton_quant.compile_cases("row"))
def quantize_fp8_per_channel(x, *, eps):
    """Triton per-row fp8 quantization (two passes over each row)."""
    return triton_quant.row_quant(_unit_k(x), eps)


@register("gemm", "quantize_fp8_per_tensor", **_KW_QUANT, formats={"x": _IN},
          compile_cases=lambda: triton_quant.compile_cases("tensor"))
def quantize_fp8_per_tensor(x, scale, *, eps):
    """Triton per-tensor fp8 quantization (dynamic: atomic-max pass, then quantize)."""
    return triton_quant.tensor_quant(x.contiguous(), scale, eps)
