"""Benchmarks of the gemm family against cuBLAS (torch.mm) and cuBLAS blockwise fp8
(`torch._scaled_mm` with 1x128 / 128x128 scales), timed in the same run.

gemm.mm: TFLOP/s (bytes = both operands and c once). gemm.gemv / gemm.fp8_block_mm at small M:
GB/s counts the *weight* bytes only (what a decode GEMM must stream), so the figure is the
weight bandwidth the issue's targets name; at M = 4096 read TFLOP/s.
"""
from __future__ import annotations

import torch

import tskernels
import tskernels_ref.gemm as ref

from ..core import Bench, register_bench

DTYPE = torch.bfloat16
LLAMA_PREFILL = [{"M": 4096, "N": 6144, "K": 4096}, {"M": 4096, "N": 28672, "K": 4096},
                 {"M": 4096, "N": 4096, "K": 4096}, {"M": 4096, "N": 4096, "K": 14336}]
MM_SHAPES = [{"M": 8192, "N": 8192, "K": 8192}] + LLAMA_PREFILL
# Llama-3-8B decode projections: fused qkv, o, fused gate-up, down
LLAMA_PROJ = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
GEMV_SHAPES = [{"M": m, "N": n, "K": k} for m in (1, 16) for n, k in LLAMA_PROJ]
DSV3 = [(7168, 2048), (2112, 7168), (24576, 1536), (7168, 16384)]
FP8_SHAPES = [{"M": m, "N": n, "K": k} for m in (1, 16, 64, 4096) for n, k in DSV3]
CPU_SHAPES = [{"M": 8, "N": 256, "K": 256}]


def _mm_make(shape, device, gen):
    m, n, k = shape["M"], shape["N"], shape["K"]
    a = torch.randn(m, k, device=device, generator=gen).to(DTYPE)
    b = (torch.randn(n, k, device=device, generator=gen) / k ** 0.5).to(DTYPE)
    d = {"a": a, "b": b}
    if shape.get("res"):
        d["r"] = torch.randn(m, n, device=device, generator=gen).to(DTYPE)
    return d


def _mm_bytes(s):
    return (s["M"] * s["K"] + s["N"] * s["K"] + s["M"] * s["N"]) * DTYPE.itemsize


register_bench(Bench(
    "gemm.mm", MM_SHAPES, _mm_make,
    ours=lambda d: tskernels.gemm.mm(d["a"], d["b"]),
    baselines={"cublas": lambda d: torch.mm(d["a"], d["b"].t())},
    bytes=_mm_bytes, flops=lambda s: 2 * s["M"] * s["N"] * s["K"], cpu_shapes=CPU_SHAPES))


def _cublas_gemv(d):
    c = torch.mm(d["a"], d["b"].t())
    return c + d["r"] if "r" in d else c


register_bench(Bench(
    "gemm.gemv", GEMV_SHAPES, _mm_make,
    ours=lambda d: tskernels.gemm.gemv(d["a"], d["b"], residual=d.get("r")),
    baselines={"cublas": _cublas_gemv},
    bytes=lambda s: s["N"] * s["K"] * DTYPE.itemsize,
    flops=lambda s: 2 * s["M"] * s["N"] * s["K"], cpu_shapes=CPU_SHAPES))


def _fp8_make(shape, device, gen):
    m, n, k = shape["M"], shape["N"], shape["K"]
    qa, sa = ref.quantize_fp8_per_token_group(torch.randn(m, k, device=device, generator=gen))
    qb, sb = ref.quantize_fp8_block(torch.randn(n, k, device=device, generator=gen) * 0.05)
    # cuBLAS wants the 1x128 activation scales outer-dim-major (M contiguous)
    return {"a": qa, "sa": sa, "b": qb, "sb": sb, "sa_t": sa.t().contiguous().t()}


def scaled_mm_blockwise(d):
    """cuBLAS block-scaled fp8 GEMM through torch._scaled_mm (1x128 and 128x128 scales)."""
    return torch._scaled_mm(d["a"], d["b"].t(), scale_a=d["sa_t"], scale_b=d["sb"].t(),
                            out_dtype=torch.bfloat16)


register_bench(Bench(
    "gemm.fp8_block_mm", FP8_SHAPES, _fp8_make,
    ours=lambda d: tskernels.gemm.fp8_block_mm(d["a"], d["sa"], d["b"], d["sb"]),
    baselines={"cublas_blockwise": scaled_mm_blockwise},
    bytes=lambda s: s["N"] * s["K"],
    flops=lambda s: 2 * s["M"] * s["N"] * s["K"],
    cpu_shapes=[{"M": 4, "N": 256, "K": 256}]))


QUANT_SHAPES = [{"T": 1, "K": 7168}, {"T": 64, "K": 7168}, {"T": 4096, "K": 7168}]


def _quant_make(shape, device, gen):
    return {"x": torch.randn(shape["T"], shape["K"], device=device, generator=gen).to(DTYPE)}


register_bench(Bench(
    "gemm.quantize_fp8_per_token_group", QUANT_SHAPES, _quant_make,
    ours=lambda d: tskernels.gemm.quantize_fp8_per_token_group(d["x"]),
    baselines={"torch_eager": lambda d: ref.quantize_fp8_per_token_group(d["x"])},
    bytes=lambda s: s["T"] * s["K"] * 3 + s["T"] * (s["K"] // 128) * 4,
    cpu_shapes=[{"T": 4, "K": 1024}]))

register_bench(Bench(
    "gemm.silu_and_mul_quantize_fp8", QUANT_SHAPES, _quant_make,
    ours=lambda d: tskernels.gemm.silu_and_mul_quantize_fp8(d["x"]),
    baselines={"torch_eager": lambda d: ref.silu_and_mul_quantize_fp8(d["x"])},
    bytes=lambda s: s["T"] * s["K"] * 2 + s["T"] * s["K"] // 2 + s["T"] * (s["K"] // 256) * 4,
    cpu_shapes=[{"T": 4, "K": 1024}]))
