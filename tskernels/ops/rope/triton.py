"""Triton RoPE: one program rotates HEADS heads of one token.

Each program loads the token's cos/sin row once (fp32) and applies it to a [HEADS, r/2] tile of
pair elements; neox pairs (i, i + r/2), gptj pairs (2i, 2i + 1). Dims past r are copied when the
output is a new tensor, left alone in place.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning
from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared import pdl

# q and k rotated by one launch (_rope_qk_kernel, q's tuned config for both) instead of one
# each: one launch less per attention layer (on by default with the chain since the H200 A/B,
# benchmarks/RESULTS.md "Session 16"); a chained rope (shared/pdl.CHAIN) takes that kernel too.
ONE_LAUNCH = True
# ...up to this many tokens: past it one launch each is faster (its k grid runs q's head blocks,
# half empty for GQA). H200, Llama-3-8B heads (32 q / 8 kv, D 128, bf16), graph replay, best of
# two, us, one launch / two (benchmarks/results/h200/s23_rope_ab.json): T = 1 0.87 / 1.59,
# 64 1.66 / 2.04, 256 5.97 / 5.16, 1024 7.22 / 7.50, 4096 27.11 / 25.43, 16384 107.19 / 91.32,
# 32768 213.87 / 178.58
ONE_LAUNCH_MAX_T = 128


@triton.jit
def _rope_kernel(x_ptr, y_ptr, pos_ptr, cache_ptr, H, D, x_s0, x_s1, y_s0, y_s1, cache_s0,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, HEADS: tl.constexpr,
                 BLOCK_D: tl.constexpr, GPTJ: tl.constexpr, COPY_REST: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    i = tl.arange(0, BLOCK_HALF)
    hmask = heads < H
    imask = i < HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * cache_s0 + i, mask=imask, other=1.0)[None, :]
    sin = tl.load(cache_ptr + pos * cache_s0 + HALF + i, mask=imask, other=0.0)[None, :]
    if GPTJ:
        ia = 2 * i
        ib = 2 * i + 1
    else:
        ia = i
        ib = i + HALF
    m = hmask[:, None] & imask[None, :]
    xrow = x_ptr + t * x_s0 + heads[:, None] * x_s1
    yrow = y_ptr + t * y_s0 + heads[:, None] * y_s1
    a = tl.load(xrow + ia[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(xrow + ib[None, :], mask=m, other=0.0).to(tl.float32)
    ya = a * cos - b * sin
    yb = b * cos + a * sin
    tl.store(yrow + ia[None, :], ya.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(yrow + ib[None, :], yb.to(y_ptr.dtype.element_ty), mask=m)
    if COPY_REST:
        d = 2 * HALF + tl.arange(0, BLOCK_D)
        mr = hmask[:, None] & (d < D)[None, :]
        rest = tl.load(xrow + d[None, :], mask=mr, other=0.0)
        tl.store(yrow + d[None, :], rest, mask=mr)


@triton.jit
def _rope_qk_kernel(q_ptr, qo_ptr, k_ptr, ko_ptr, pos_ptr, cache_ptr, Hq, Hk, D, q_s0, q_s1,
                    qo_s0, qo_s1, k_s0, k_s1, ko_s0, ko_s1, cache_s0,
                    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, HEADS: tl.constexpr,
                    BLOCK_D: tl.constexpr, GPTJ: tl.constexpr, COPY_REST: tl.constexpr,
                    PDL: tl.constexpr):
    """_rope_kernel over q and k in one launch: grid (T, head blocks, 1 or 2), axis 2 picks q
    (0) or k (1); a head block past its tensor's heads is masked out whole. PDL: chained
    (shared/pdl.py): dependents may launch at once, then wait for the qkv rows. The tuned
    tables key on _rope_kernel's source, which this wrapper leaves as it is."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    if tl.program_id(2) == 0:
        _rope_kernel(q_ptr, qo_ptr, pos_ptr, cache_ptr, Hq, D, q_s0, q_s1, qo_s0, qo_s1,
                     cache_s0, HALF, BLOCK_HALF, HEADS, BLOCK_D, GPTJ, COPY_REST)
    else:
        _rope_kernel(k_ptr, ko_ptr, pos_ptr, cache_ptr, Hk, D, k_s0, k_s1, ko_s0, ko_s1,
                     cache_s0, HALF, BLOCK_HALF, HEADS, BLOCK_D, GPTJ, COPY_REST)


def _prune(cfg, p, target) -> str | None:
    if cfg["heads"] > 2 * triton.next_power_of_2(p["H"]):
        return "more heads per program than twice the heads"
    if cfg["num_warps"] * target.warp_size > cfg["heads"] * triton.next_power_of_2(p["D"] // 2) * 2:
        return "more threads than elements per program"
    return None


def _runner(p, device):
    from tskernels_ref.rope import apply_rope as ref_rope, cos_sin_cache as ref_cache
    T, H, D, dt = p["T"], p["H"], p["D"], getattr(torch, p.get("dtype", "bfloat16"))
    cache = ref_cache(4096, D).to(device)
    gptj = p.get("style", "neox") == "gptj"

    def make(d):
        return (torch.randn(T, H, D, device=d, dtype=dt),
                torch.randint(0, 4096, (T,), device=d, dtype=torch.int64))

    def ref(x):
        return ref_rope(x[0].double(), None, x[1], cache.double(), style=p.get("style", "neox"))[0]
    return tuning.TensorRunner(make, lambda cfg, x: _rotate(x[0], x[1], cache, gptj, False, cfg),
                               ref, device)


SPACE = declare(KernelSpace(
    "rope.apply_rope.triton", Space(heads=[1, 2, 4, 8, 16, 32], num_warps=[1, 2, 4, 8]),
    key=lambda p: {"H": pow2_bucket(p["H"]), "D": pow2_bucket(p["D"]),
                   "T": tuning.rows_bucket(p["T"]), "dtype": p.get("dtype", "bfloat16")},
    heuristic=lambda p: {"heads": min(16, triton.next_power_of_2(p["H"])), "num_warps": 4},
    prune=_prune, source=lambda: jit_source(_rope_kernel), runner=_runner,
    parse=tuning.parse_shape, example={"T": 64, "H": 32, "D": 128, "dtype": "bfloat16"}))


def _rotate(x, positions, cache, gptj, inplace, cfg: dict | None = None):
    T, H, D = x.shape
    y = x if inplace else torch.empty_like(x)
    if T == 0 or H == 0:
        return y
    half = cache.shape[1] // 2
    if cfg is None:
        cfg = tuning.config(SPACE, {"T": T, "H": H, "D": D, "dtype": tuning.dtype_name(x.dtype)},
                            x.device)
    heads = cfg["heads"]
    copy_rest = (not inplace) and 2 * half < D
    _rope_kernel[(T, triton.cdiv(H, heads))](
        x, y, positions, cache, H, D, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        cache.stride(0), HALF=half, BLOCK_HALF=triton.next_power_of_2(half), HEADS=heads,
        BLOCK_D=triton.next_power_of_2(max(D - 2 * half, 1)), GPTJ=gptj, COPY_REST=copy_rest,
        num_warps=cfg["num_warps"])
    return y


def _qk_pair(q, k, inplace, positions, cache, gptj, cfg: dict | None = None):
    """(qo, ko) from one _rope_qk_kernel launch (ONE_LAUNCH / chained), k None: q alone (a
    chained launch). q / k [T, H, D] of one T, dtype and D; q's tuned config for both."""
    T, Hq, D = q.shape
    Hk = 0 if k is None else k.shape[1]
    qo = q if inplace else torch.empty_like(q)
    ko = None if k is None else (k if inplace else torch.empty_like(k))
    if T == 0 or max(Hq, Hk) == 0:
        return qo, ko
    half = cache.shape[1] // 2
    if cfg is None:
        cfg = tuning.config(SPACE, {"T": T, "H": Hq, "D": D, "dtype": tuning.dtype_name(q.dtype)},
                            q.device)
    heads = cfg["heads"]
    extra = pdl.launch_args(q.device) if pdl.chained("rope") else {"PDL": False}
    kk, kko = (q, qo) if k is None else (k, ko)
    _rope_qk_kernel[(T, triton.cdiv(max(Hq, Hk), heads), 1 if k is None else 2)](
        q, qo, kk, kko, positions, cache, Hq, Hk, D, q.stride(0), q.stride(1), qo.stride(0),
        qo.stride(1), kk.stride(0), kk.stride(1), kko.stride(0), kko.stride(1), cache.stride(0),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), HEADS=heads,
        BLOCK_D=triton.next_power_of_2(max(D - 2 * half, 1)), GPTJ=gptj,
        COPY_REST=(not inplace) and 2 * half < D, num_warps=cfg["num_warps"], **extra)
    return qo, ko


def _cases():
    sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "pos_ptr": "*i64", "cache_ptr": "*fp32",
           "H": "i32", "D": "i32", "x_s0": "i32", "x_s1": "i32", "y_s0": "i32", "y_s1": "i32",
           "cache_s0": "i32"}
    c = dict(HALF=64, BLOCK_HALF=64, HEADS=16, BLOCK_D=1, COPY_REST=False)
    qk = {"q_ptr": "*bf16", "qo_ptr": "*bf16", "k_ptr": "*bf16", "ko_ptr": "*bf16",
          "pos_ptr": "*i64", "cache_ptr": "*fp32", "Hq": "i32", "Hk": "i32", "D": "i32",
          **{f"{t}_s{i}": "i32" for t in ("q", "qo", "k", "ko") for i in (0, 1)},
          "cache_s0": "i32"}
    return [CompileCase(_rope_kernel, sig, dict(c, GPTJ=g), label=f"gptj={g}")
            for g in (False, True)] + [
        # q and k in one launch (ONE_LAUNCH), plain and chained (shared/pdl.CHAIN)
        CompileCase(_rope_qk_kernel, qk, dict(c, GPTJ=False, PDL=False), label="q+k"),
        CompileCase(_rope_qk_kernel, qk, dict(c, GPTJ=False, PDL=True), targets=pdl.TARGETS,
                    label="q+k pdl")]


@register("rope", "apply_rope", **TRITON, formats={"q": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_cases)
def apply_rope(q, k, positions, cos_sin_cache, *, style, inplace):
    """Triton RoPE over q and k (one launch each, or one for both: ONE_LAUNCH, up to
    ONE_LAUNCH_MAX_T tokens)."""
    cache = cos_sin_cache if cos_sin_cache.dtype == torch.float32 else cos_sin_cache.float()
    gptj = style == "gptj"
    one = ONE_LAUNCH and q.shape[0] <= ONE_LAUNCH_MAX_T
    if pdl.chained("rope") or (one and k is not None):
        pair = k is not None and one and k.shape[0] == q.shape[0] and \
            k.shape[2] == q.shape[2] and k.dtype == q.dtype
        qo, ko = _qk_pair(q, k if pair else None, inplace, positions, cache, gptj)
        if k is None or pair:
            return qo, ko
        return qo, _qk_pair(k, None, inplace, positions, cache, gptj)[0]
    qo = _rotate(q, positions, cache, gptj, inplace)
    ko = None if k is None else _rotate(k, positions, cache, gptj, inplace)
    return qo, ko
