"""Triton store_mla: scatter new tokens' latent rows into their page slots (fp8
quantize-on-write). One program per token; a negative slot (padding) is skipped inside the
kernel, so the write never waits on the host and is CUDA-graph capturable (the reference's
mask check synchronises, which kept MLA models' decode steps out of CUDA graphs).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from ...platform import interpreter_enabled
from ...registry import register
from .._common import TRITON
from ..shared.triton_math import round_to_e4m3_grid


@triton.jit
def _store_mla_kernel(x_ptr, cache_ptr, slot_ptr, scale_ptr, W, x_s0,
                      QUANT: tl.constexpr, BLOCK_W: tl.constexpr,
                      SOFT_ROUND: tl.constexpr = False):
    """cache[slot] = x[t]  (or clamp(x / scale, +-448) as e4m3 when QUANT)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    w = tl.arange(0, BLOCK_W)
    m = w < W
    x = tl.load(x_ptr + t * x_s0 + w, mask=m, other=0.0)
    if QUANT:
        x = tl.clamp(x.to(tl.float32) / tl.load(scale_ptr), -448.0, 448.0)
        if SOFT_ROUND:
            x = round_to_e4m3_grid(x)
    # (a narrowing cast rounds to nearest even on the GPU, as torch does; the interpreter
    # truncates fp32 -> bf16, see tests/kernels/test_store_mla.py)
    tl.store(cache_ptr + slot * W + w, x.to(cache_ptr.dtype.element_ty), mask=m)


def _cases():
    out = []
    for cache_t, quant in (("*bf16", False), ("*fp8e4nv", True)):
        sig = {"x_ptr": "*bf16", "cache_ptr": cache_t, "slot_ptr": "*i64",
               "scale_ptr": "*fp32", "W": "i32", "x_s0": "i32"}
        out.append(CompileCase(_store_mla_kernel, sig, dict(QUANT=quant, BLOCK_W=1024),
                               label="fp8" if quant else "bf16"))
    return out


@register("kvcache", "store_mla", **TRITON,
          formats={"kv_latent": ("fp32", "fp16", "bf16"),
                   "kv": ("fp32", "fp16", "bf16", "fp8_e4m3:per_tensor")},
          tags=("deterministic",), compile_cases=_cases)
def store_mla(kv_latent, kv_cache, slot_mapping, *, kv_scale=None):
    """Triton paged latent-row write, optional fp8 quantize-on-write."""
    T, W = kv_latent.shape
    if T == 0:
        return
    quant = kv_cache.dtype == torch.float8_e4m3fn
    _store_mla_kernel[(T,)](
        kv_latent, kv_cache, slot_mapping, kv_scale if quant else slot_mapping, W,
        kv_latent.stride(0), QUANT=quant, BLOCK_W=triton.next_power_of_2(W),
        SOFT_ROUND=quant and interpreter_enabled(), num_warps=4)
