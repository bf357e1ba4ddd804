"""Triton store_kv: scatter new tokens' K/V rows into their page slots (fp8 quantize-on-write).

One program per token writes all of its KV heads for both K and V, so the slot index is read
once and each cache row is a contiguous num_kv_heads * head_dim store.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...platform import interpreter_enabled
from ...registry import register
from .._common import TRITON
from . import _tune
from ..shared import pdl
from ..shared.triton_math import round_to_e4m3_grid


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, H, D,
                     k_s0, k_s1, v_s0, v_s1, QUANT: tl.constexpr, PER_HEAD: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                     SOFT_ROUND: tl.constexpr = False):
    """cache[slot] = x  (or clamp(x / scale, +-448) as e4m3 when QUANT)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    m = (h < H)[:, None] & (d < D)[None, :]
    dst = slot * H * D + h[:, None] * D + d[None, :]
    k = tl.load(k_ptr + t * k_s0 + h[:, None] * k_s1 + d[None, :], mask=m, other=0.0)
    v = tl.load(v_ptr + t * v_s0 + h[:, None] * v_s1 + d[None, :], mask=m, other=0.0)
    if QUANT:
        if PER_HEAD:
            ks = tl.load(ks_ptr + h, mask=h < H, other=1.0)[:, None]
            vs = tl.load(vs_ptr + h, mask=h < H, other=1.0)[:, None]
        else:
            ks = tl.load(ks_ptr)
            vs = tl.load(vs_ptr)
        k = tl.clamp(k.to(tl.float32) / ks, -448.0, 448.0)
        v = tl.clamp(v.to(tl.float32) / vs, -448.0, 448.0)
        if SOFT_ROUND:
            k = round_to_e4m3_grid(k)
            v = round_to_e4m3_grid(v)
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=m)


@triton.jit
def _store_kv_chained_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, H, D,
                             k_s0, k_s1, v_s0, v_s1, QUANT: tl.constexpr,
                             PER_HEAD: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_D: tl.constexpr, SOFT_ROUND: tl.constexpr,
                             PDL: tl.constexpr):
    """_store_kv_kernel chained (shared/pdl.py): it lets its dependent launch at once and
    waits for the rotated k (and v) before anything else, the skipped-slot exit included.
    The tuned tables key on _store_kv_kernel's source, which this wrapper leaves as it is."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, H, D, k_s0, k_s1,
                     v_s0, v_s1, QUANT, PER_HEAD, BLOCK_H, BLOCK_D, SOFT_ROUND)


def _cases():
    out = []
    for cache_t, quant in (("*bf16", False), ("*fp8e4nv", True)):
        sig = {"k_ptr": "*bf16", "v_ptr": "*bf16", "kc_ptr": cache_t, "vc_ptr": cache_t,
               "slot_ptr": "*i64", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "H": "i32", "D": "i32",
               "k_s0": "i32", "k_s1": "i32", "v_s0": "i32", "v_s1": "i32"}
        c = dict(QUANT=quant, PER_HEAD=quant, BLOCK_H=8, BLOCK_D=128)
        out.append(CompileCase(_store_kv_kernel, sig, c, label="fp8" if quant else "bf16"))
        # chained (shared/pdl.CHAIN), as sm_90+ launches it
        out.append(CompileCase(_store_kv_chained_kernel, sig,
                               dict(c, SOFT_ROUND=False, PDL=True), targets=pdl.TARGETS,
                               label="fp8" if quant else "bf16"))
    return out


@register("attention", "store_kv", **TRITON,
          formats={"k": ("fp32", "fp16", "bf16"),
                   "kv": ("fp32", "fp16", "bf16", "fp8_e4m3:per_tensor", "fp8_e4m3:per_head")},
          tags=("deterministic",), compile_cases=_cases)
def store_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Triton paged K/V write, optional fp8 quantize-on-write."""
    _store(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def _store(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, cfg: dict | None = None):
    """cfg: {"block_h", "num_warps"}; None: the tuned one on CUDA (autotune), else the
    heuristic (block_h = heads up to 4096 elements per program, 4 warps)."""
    T, H, D = k.shape
    if T == 0:
        return
    quant = k_cache.dtype == torch.float8_e4m3fn
    block_d = triton.next_power_of_2(D)
    if cfg is None:
        cfg = _tune.store_config(T, H, D, k.dtype, k_cache.dtype, k.device) \
            if k.device.type == "cuda" else _tune._store_heuristic({"H": H, "D": D})
    block_h = cfg["block_h"]
    ks = k_scale if quant else slot_mapping  # any pointer; unused unless QUANT
    vs = v_scale if quant else slot_mapping
    kernel, extra = _store_kv_kernel, {}
    if pdl.chained("store_kv"):
        kernel, extra = _store_kv_chained_kernel, pdl.launch_args(k.device)
    kernel[(T, triton.cdiv(H, block_h))](
        k, v, k_cache, v_cache, slot_mapping, ks, vs, H, D, k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), QUANT=quant, PER_HEAD=quant and k_scale.numel() > 1,
        BLOCK_H=block_h, BLOCK_D=block_d, SOFT_ROUND=quant and interpreter_enabled(),
        num_warps=cfg["num_warps"], **extra)
