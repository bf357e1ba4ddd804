"""Triton rope_store_kv: per-head q/k RMSNorm (optional) + RoPE + the paged K/V write, one launch.

Grid (T, q head blocks + KV head blocks). A q program normalises and rotates Q_HEADS heads of
its token into q_out; a KV program does the same for KV_HEADS heads of k, writing them straight
into the token's cache slot, and copies the same heads of v there (a negative slot: the KV
program does nothing). Each program loads a head's rotary pairs as two [HEADS, r/2] tiles (neox
(i, i + r/2), gptj (2i, 2i + 1)) plus the dims past r, so the norm's sum of squares and the
rotation need no shuffle. Roundings as the separate ops make them: the normed values are
rounded to the activation dtype before the rotation reads them, the rotated ones before the
cache cast.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from . import _tune
from ..shared import pdl


@triton.jit
def _norm_rope_heads(x_ptr, y_ptr, x_s1, y_s1, w_ptr, eps, h0, H, D, cos, sin,
                     HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
                     HEADS: tl.constexpr, GPTJ: tl.constexpr, NORM: tl.constexpr,
                     HAS_REST: tl.constexpr):
    """y[h] = rope(rmsnorm(x[h]) rounded to x's dtype) for heads h0 .. h0 + HEADS - 1 < H;
    y rounded to x's dtype, then to y's. x_ptr / y_ptr point at the token's row."""
    heads = h0 + tl.arange(0, HEADS)
    hmask = heads < H
    i = tl.arange(0, BLOCK_HALF)
    imask = i < HALF
    if GPTJ:
        ia = 2 * i
        ib = 2 * i + 1
    else:
        ia = i
        ib = i + HALF
    m = hmask[:, None] & imask[None, :]
    xrow = x_ptr + heads[:, None] * x_s1
    yrow = y_ptr + heads[:, None] * y_s1
    a = tl.load(xrow + ia[None, :], mask=m, other=0.0)
    b = tl.load(xrow + ib[None, :], mask=m, other=0.0)
    d = 2 * HALF + tl.arange(0, BLOCK_REST)
    mr = hmask[:, None] & (d < D)[None, :]
    if HAS_REST:
        rest = tl.load(xrow + d[None, :], mask=mr, other=0.0)
    if NORM:
        af = a.to(tl.float32)
        bf = b.to(tl.float32)
        ss = tl.sum(af * af, axis=1) + tl.sum(bf * bf, axis=1)
        if HAS_REST:
            rf = rest.to(tl.float32)
            ss += tl.sum(rf * rf, axis=1)
        inv = tl.rsqrt(ss / D + eps)[:, None]
        wa = tl.load(w_ptr + ia, mask=imask, other=0.0).to(tl.float32)[None, :]
        wb = tl.load(w_ptr + ib, mask=imask, other=0.0).to(tl.float32)[None, :]
        a = (af * inv * wa).to(x_ptr.dtype.element_ty)
        b = (bf * inv * wb).to(x_ptr.dtype.element_ty)
        if HAS_REST:
            wr = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
            rest = (rf * inv * wr).to(x_ptr.dtype.element_ty)
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    ya = a * cos - b * sin
    yb = b * cos + a * sin
    out_t = y_ptr.dtype.element_ty
    tl.store(yrow + ia[None, :], ya.to(x_ptr.dtype.element_ty).to(out_t), mask=m)
    tl.store(yrow + ib[None, :], yb.to(x_ptr.dtype.element_ty).to(out_t), mask=m)
    if HAS_REST:
        tl.store(yrow + d[None, :], rest.to(out_t), mask=mr)


@triton.jit
def _rope_store_kv_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, pos_ptr, cache_ptr,
                          slot_ptr, qw_ptr, kw_ptr, Hq, Hkv, D, q_s0, q_s1, k_s0, k_s1, v_s0,
                          v_s1, qo_s0, qo_s1, cache_s0, eps, HALF: tl.constexpr,
                          BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
                          BLOCK_D: tl.constexpr, Q_HEADS: tl.constexpr,
                          KV_HEADS: tl.constexpr, GPTJ: tl.constexpr, NORM: tl.constexpr,
                          HAS_REST: tl.constexpr, PDL: tl.constexpr):
    """q_out = rope(norm_q(q)); cache[slot] = rope(norm_k(k)), v (slot >= 0). PDL: chained
    (shared/pdl.py): dependents may launch at once, then wait for the qkv rows before any
    load or store, the skipped-slot exit included."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    n_qb = tl.cdiv(Hq, Q_HEADS)
    i = tl.arange(0, BLOCK_HALF)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * cache_s0 + i, mask=i < HALF, other=1.0)[None, :]
    sin = tl.load(cache_ptr + pos * cache_s0 + HALF + i, mask=i < HALF, other=0.0)[None, :]
    if blk < n_qb:
        _norm_rope_heads(q_ptr + t * q_s0, qo_ptr + t * qo_s0, q_s1, qo_s1, qw_ptr, eps,
                         blk * Q_HEADS, Hq, D, cos, sin, HALF, BLOCK_HALF, BLOCK_REST, Q_HEADS,
                         GPTJ, NORM, HAS_REST)
    else:
        slot = tl.load(slot_ptr + t)
        if slot >= 0:
            h0 = (blk - n_qb) * KV_HEADS
            row = slot * Hkv * D
            _norm_rope_heads(k_ptr + t * k_s0, kc_ptr + row, k_s1, D, kw_ptr, eps, h0, Hkv, D,
                             cos, sin, HALF, BLOCK_HALF, BLOCK_REST, KV_HEADS, GPTJ, NORM,
                             HAS_REST)
            h = h0 + tl.arange(0, KV_HEADS)
            dd = tl.arange(0, BLOCK_D)
            m = (h < Hkv)[:, None] & (dd < D)[None, :]
            v = tl.load(v_ptr + t * v_s0 + h[:, None] * v_s1 + dd[None, :], mask=m, other=0.0)
            tl.store(vc_ptr + row + h[:, None] * D + dd[None, :],
                     v.to(vc_ptr.dtype.element_ty), mask=m)


def _launch(q, k, v, positions, cache, k_cache, v_cache, slot_mapping, gptj, q_norm_weight,
            k_norm_weight, eps, cfg: dict | None = None):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    qo = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0:
        return qo
    half = cache.shape[1] // 2
    if cfg is None:
        cfg = _tune.rope_store_config(T, Hq, Hkv, D, q.dtype, q.device)
    q_heads = min(cfg["heads"], triton.next_power_of_2(Hq))
    kv_heads = min(cfg["heads"], triton.next_power_of_2(Hkv))
    norm = q_norm_weight is not None
    extra = pdl.launch_args(q.device) if pdl.chained("rope_store_kv") else {"PDL": False}
    grid = (T, triton.cdiv(Hq, q_heads) + triton.cdiv(Hkv, kv_heads))
    _rope_store_kv_kernel[grid](
        q, k, v, qo, k_cache, v_cache, positions, cache, slot_mapping,
        q_norm_weight if norm else q, k_norm_weight if norm else k,  # any pointer unless NORM
        Hq, Hkv, D, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), qo.stride(0), qo.stride(1), cache.stride(0), float(eps), HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(max(D - 2 * half, 1)),
        BLOCK_D=triton.next_power_of_2(D), Q_HEADS=q_heads, KV_HEADS=kv_heads, GPTJ=gptj,
        NORM=norm, HAS_REST=2 * half < D, num_warps=cfg["num_warps"], **extra)
    return qo


def _cases():
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "qo_ptr": "*bf16",
           "kc_ptr": "*bf16", "vc_ptr": "*bf16", "pos_ptr": "*i64", "cache_ptr": "*fp32",
           "slot_ptr": "*i64", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "Hq": "i32", "Hkv": "i32",
           "D": "i32", **{f"{t}_s{i}": "i32" for t in ("q", "k", "v", "qo") for i in (0, 1)},
           "cache_s0": "i32", "eps": "fp32"}
    # the served shapes: D 128, full rotary, 16 heads per program, Qwen3 (norm) and Llama
    c = dict(HALF=64, BLOCK_HALF=64, BLOCK_REST=1, BLOCK_D=128, Q_HEADS=16, KV_HEADS=8,
             GPTJ=False, HAS_REST=False)
    return [CompileCase(_rope_store_kv_kernel, sig, dict(c, NORM=n, PDL=False),
                        label=f"norm={n}") for n in (False, True)] + [
        # chained (shared/pdl.CHAIN), as sm_90+ launches it
        CompileCase(_rope_store_kv_kernel, sig, dict(c, NORM=n, PDL=True), targets=pdl.TARGETS,
                    label=f"norm={n} pdl") for n in (False, True)]


@register("attention", "rope_store_kv", **TRITON,
          formats={"q": ("fp32", "fp16", "bf16"), "kv": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_cases)
def rope_store_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, *, style,
                  q_norm_weight=None, k_norm_weight=None, eps=1e-6):
    """Triton q/k RMSNorm + RoPE + paged K/V write in one launch (decode steps)."""
    cache = cos_sin_cache if cos_sin_cache.dtype == torch.float32 else cos_sin_cache.float()
    return _launch(q, k, v, positions, cache, k_cache, v_cache, slot_mapping, style == "gptj",
                   q_norm_weight, k_norm_weight, eps)

