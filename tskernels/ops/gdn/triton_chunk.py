"""Triton chunked gated delta rule prefill (chunk 64, ragged batches, grouped value heads).

Launches over (chunk, value head) or (value block, sequence x value head):

1. WY factors, default "split" variant in two kernels:
   `_wy_solve_kernel` (per chunk): the in-chunk cumulative decay G, the 16 x 16 blocks of
   A = beta_i e^(G_i - G_j) k_i.k_j (j < i) from BK-column pieces of the keys, T = (I + A)^-1 —
   the four diagonal blocks by the product (I + n)(I + n^2)(I + n^4)(I + n^8) (n = -A_ii,
   nilpotent) and the block-triangular merge on tf32 tensor cores — stored as a [64, 64] tile
   in the activations' dtype; `_wy_apply_kernel`: W = T (beta e^G K) and U = T (beta V) as
   64-row products. The "fused" variant (`_wy_kernel`) does both in one kernel with 16-row
   products; "wy64" (_wy64.py) computes the same factors with an fp32 scratch tile.
2. `_state_kernel` (sequential over a sequence's chunks, one program per value block): stores
   the chunk-start state H_c, V'_c = U_c - W_c H_c, and H_(c+1) = e^(G_C) H_c + (e^(G_C - G) K)^T V'.
3. `_output_kernel` (per chunk and value block): O = (e^G Q) H_c +
   [(Q K^T) e^(G_i - G_j)]_(j <= i) V', times scale.
q / k L2 normalisation (Qwen3-Next) is one launch before them (`l2norm`), or (split variant;
sm_90's choice for a state grid within the SMs, see _launch_rule) scales applied inside them.
Overlap (the default "output" on sm_90, see DEFAULT_OVERLAP): 3 runs beside 2, and with opt-in
"all" 2 beside 1's W / U half, through per-chunk counters and programmatic dependent launches
(docs/OPS.md).

Ragged batches need no host sync: the grid is an upper bound on the chunk count
(T // 64 + N), `chunk_offsets` (cumulative chunks per sequence, computed on the device) maps a
program to its sequence by binary search, and programs past the last chunk exit
(tskernels/ops/shared/ragged.py).
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from ...compile import CompileCase
from ...platform import platform_of
from ...registry import register
from .._common import TRITON
from . import _tune
from ..shared import pdl
from ..shared.ragged import block_bounds, block_offsets, search_steps
from ._validate import CHUNK, FORMATS, head_dim_ok
from ._wy64 import (_chunk_rows, _dot, _inv_unit_lower, _inv_unit_lower_pow, _mm,
                    _wy64_kernel)

# The WY launch a plain call gets: "split" (`_wy_solve_kernel` + `_wy_apply_kernel`: T through
# memory, W / U as 64-row products; the default since session 20), "fused" (`_wy_kernel`, one
# kernel, 16-row W / U products) or "wy64" (`_wy64_kernel`, opt-in, slower). All three are
# run-verified on the H200. Switching the default is this line.
DEFAULT_VARIANT = "split"
VARIANTS = ("fused", "wy64", "split")
# The fused WY kernel's diagonal 16 x 16 solve: "subst" (14-step forward substitution) or
# "pow" (the product (I + n)(I + n^2)(I + n^4)(I + n^8), no serial chain: the WY kernel
# 752 -> 527 us at T = 16k on the H200, benchmarks/RESULTS.md session 20)
DEFAULT_SOLVE = "pow"
SOLVES = ("subst", "pow")
# the output kernel's launch: warps and value columns per program. H200, session 20, whole
# prefill at T = 16k: 4 warps x 128 columns 1220.9 us, x 64 columns 1244.2, 8 warps x 64
# 1752.6; the output kernel alone 448 us at 8 warps x 128 (the old launch), 295 at 4 x 64
OUT_WARPS = 4
OUT_BV = 128
# the "split" variant's solve kernel: warps, key columns per K K^T piece, and the block merge's
# products on tf32 tensor cores (bf16 / fp16 activations only; T is then rounded to their dtype
# for the W / U products). H200, session 20, whole prefill at T = 16k: 2 warps + tf32 1045.8 us
# (solve kernel 215), 4 warps + tf32 1149.8, 4 warps exact fp32 1187.6 (solve 356), "fused"
# 1210.9; outputs within 1.24e-3 rel rms of the exact merge's
SPLIT_WARPS = 2
SPLIT_BK = 32
SPLIT_TF32 = True
# q / k L2 normalisation (use_qk_l2norm): "launch" (one kernel writes normalised copies) or
# "fused" (split variant only: the kernels scale by the rsqrt norms as they go). DEFAULT_NORM
# is the plain call's choice except where _launch_rule picks (sm_90, below)
DEFAULT_NORM = "launch"
NORMS = ("launch", "fused")
# The state kernel's value columns per program (tuning "state_bv"); on OUTPUT_TARGETS a plain
# call picks by the state grid (sequences x value heads x value blocks) against the SM count
# (_launch_rule): STATE_BV while that grid fits on the SMs (one 4-warp program per SM, each a
# serial chain of chunks, latency-bound), STATE_BV_WIDE where it would not (fewer, wider
# programs: a throughput-bound grid), and the fused q / k norm only where the chosen grid fits
# (its rsqrt scaling rides in the state programs: free while they wait on latency, not once
# they queue). H200, session 22, overlap "output" (benchmarks/RESULTS.md, graph replay, us,
# launch norm / fused norm / state_bv 64): T = 16k 995.7 / 947.7 / 1067.2, 64k 3945.5 /
# 3782.0 / 4229.2, varlen 8 x 4k 1957.4 / 2012.2 / 1815.9 (fused + 64: 1862.7). The fused norm
# is also the more accurate (bf16, T = 4k: o rel rms 3.71e-3 against 4.40e-3 for the launch and
# for flash-linear-attention, from a float64 reference)
STATE_BV = 32
STATE_BV_WIDE = 64
# Overlapped launches (per-chunk flags, programmatic dependent launches on sm_90+): "output"
# (or True): the output kernel runs chunk c as soon as the state recurrence has passed it, not
# after it (the recurrence keeps one 4-warp program per SM busy, the output work fills the
# rest); "all" (split variant): also the W / U products, a persistent kernel the recurrence
# follows OVERLAP_SEG chunks at a time. A plain call takes "output" on OUTPUT_TARGETS (where it
# was timed) when PDL exists, else False. H200, session 22 (benchmarks/RESULTS.md; graph replay,
# median of 3 rounds, us, no overlap -> "output" with 2 state stages): T = 4k 277.0 -> 267.7,
# 16k 1031.2 -> 992.1, 64k 4174.2 -> 3940.9, varlen 8 x 4k 2097.3 -> 1952.3; "all" was slower
# than no overlap on every shape.
DEFAULT_OVERLAP = "output"
OUTPUT_TARGETS = ("sm_90",)
# the state kernel's software-pipeline stages under overlap "output" (tuning "state_stages"
# overrides): 2 leave shared memory for an output program beside each state program (82 KB
# against 119 KB at Triton's default 3); without overlap 3 stay (2 were 11 % slower at 16k)
OVERLAP_STATE_STAGES = 2
OVERLAPS = (False, "output", "all")
OVERLAP_SEG = 8
# the persistent W / U kernel's programs per SM. sm_90 registers per thread (4 warps, allocated
# in 8s): this kernel 168, the waiting state kernel 184, the output kernel 192 (152 at
# out_bv=64): of 64 K registers an SM holds the state program and one of these (45 K), and an
# output program beside them only at out_bv <= 64; two (apply_per_sm=2) need apply_maxnreg=160
# (8 B of spill) or the state programs could not launch beside them until they finish
APPLY_PER_SM = 1
# where "all" is built (the compile matrix) and may run: its state kernel spills on sm_100 (48 B)
ALL_TARGETS = ("sm_90",)
WY64_WARPS = 8
WY64_COLS = 64  # the W / U products' column piece

BT = tl.constexpr(CHUNK)  # chunk length
BC = tl.constexpr(16)  # sub-block of the in-chunk solve


@triton.jit
def _chunk_gates(g_ptr, beta_ptr, G_ptr, bos, length, t0, hv, o, HV: tl.constexpr):
    """The chunk's four 16-row sub-blocks: cumulative decay G (also stored), beta, rows, masks."""
    # rows of sub-block b: t0 + 16 b + o; masked rows load zeros and contribute nothing
    r0, r1, r2, r3 = t0 + o, t0 + BC + o, t0 + 2 * BC + o, t0 + 3 * BC + o
    m0, m1, m2, m3 = r0 < length, r1 < length, r2 < length, r3 < length
    g0 = tl.cumsum(tl.load(g_ptr + (bos + r0) * HV + hv, mask=m0, other=0.0), 0)
    g1 = tl.cumsum(tl.load(g_ptr + (bos + r1) * HV + hv, mask=m1, other=0.0), 0) + tl.sum(tl.where(o == BC - 1, g0, 0.0), 0)
    g2 = tl.cumsum(tl.load(g_ptr + (bos + r2) * HV + hv, mask=m2, other=0.0), 0) + tl.sum(tl.where(o == BC - 1, g1, 0.0), 0)
    g3 = tl.cumsum(tl.load(g_ptr + (bos + r3) * HV + hv, mask=m3, other=0.0), 0) + tl.sum(tl.where(o == BC - 1, g2, 0.0), 0)
    tl.store(G_ptr + (bos + r0) * HV + hv, g0, mask=m0)
    tl.store(G_ptr + (bos + r1) * HV + hv, g1, mask=m1)
    tl.store(G_ptr + (bos + r2) * HV + hv, g2, mask=m2)
    tl.store(G_ptr + (bos + r3) * HV + hv, g3, mask=m3)
    b0 = tl.load(beta_ptr + (bos + r0) * HV + hv, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + (bos + r1) * HV + hv, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + (bos + r2) * HV + hv, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + (bos + r3) * HV + hv, mask=m3, other=0.0).to(tl.float32)

    return g0, g1, g2, g3, b0, b1, b2, b3, r0, r1, r2, r3, m0, m1, m2, m3


@triton.jit
def _mmp(a, b, TF32: tl.constexpr):
    """fp32 product of two small fp32 tiles: exact (FMA), or on tf32 tensor cores (10-bit
    mantissa: finer than the bf16 / fp16 T the W / U products then use)."""
    if TF32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return _mm(a, b)


@triton.jit
def _solve_blocks(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, o, SOLVE_POW: tl.constexpr,
                  TF32: tl.constexpr):
    """The ten 16 x 16 blocks of T = (I + A)^-1 from A's (fp32)."""
    # T = (I + A)^-1, block lower triangular: T_ii = (I + A_ii)^-1,
    # T_ij = -T_ii sum_(j <= m < i) A_im T_mj
    if SOLVE_POW:  # six independent-ish products per block instead of a 14-step chain
        t00 = _inv_unit_lower_pow(a00, o)
        t11 = _inv_unit_lower_pow(a11, o)
        t22 = _inv_unit_lower_pow(a22, o)
        t33 = _inv_unit_lower_pow(a33, o)
    else:
        t00 = _inv_unit_lower(a00, o)
        t11 = _inv_unit_lower(a11, o)
        t22 = _inv_unit_lower(a22, o)
        t33 = _inv_unit_lower(a33, o)
    t10 = -_mmp(t11, _mmp(a10, t00, TF32), TF32)
    t21 = -_mmp(t22, _mmp(a21, t11, TF32), TF32)
    t32 = -_mmp(t33, _mmp(a32, t22, TF32), TF32)
    t20 = -_mmp(t22, _mmp(a20, t00, TF32) + _mmp(a21, t10, TF32), TF32)
    t31 = -_mmp(t33, _mmp(a31, t11, TF32) + _mmp(a32, t21, TF32), TF32)
    t30 = -_mmp(t33, _mmp(a30, t00, TF32) + _mmp(a31, t10, TF32) + _mmp(a32, t20, TF32), TF32)
    return t00, t10, t11, t20, t21, t22, t30, t31, t32, t33


@triton.jit
def _chunk_T(k_ptr, g_ptr, beta_ptr, G_ptr, bos, length, t0, hv, hk,
             HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, PREC: tl.constexpr,
             SOLVE_POW: tl.constexpr):
    """One chunk's cumulative decay G (stored), beta, key tiles and the ten 16 x 16 blocks of
    T = (I + A)^-1 (fp32), as a tuple (see the module docstring)."""
    o = tl.arange(0, BC)
    ok = tl.arange(0, K)

    (g0, g1, g2, g3, b0, b1, b2, b3, r0, r1, r2, r3, m0, m1, m2, m3) = _chunk_gates(
        g_ptr, beta_ptr, G_ptr, bos, length, t0, hv, o, HV)
    kp = k_ptr + hk * K + ok[None, :]
    k0 = tl.load(kp + (bos + r0)[:, None] * (HK * K), mask=m0[:, None], other=0.0)
    k1 = tl.load(kp + (bos + r1)[:, None] * (HK * K), mask=m1[:, None], other=0.0)
    k2 = tl.load(kp + (bos + r2)[:, None] * (HK * K), mask=m2[:, None], other=0.0)
    k3 = tl.load(kp + (bos + r3)[:, None] * (HK * K), mask=m3[:, None], other=0.0)

    # A_ab = beta_a e^(G_a - G_b) k_a k_b^T (strictly lower on the diagonal blocks)
    low = o[:, None] > o[None, :]
    a00 = tl.where(low, _dot(k0, tl.trans(k0), IEEE=PREC) * tl.exp(g0[:, None] - g0[None, :]), 0.0) * b0[:, None]
    a11 = tl.where(low, _dot(k1, tl.trans(k1), IEEE=PREC) * tl.exp(g1[:, None] - g1[None, :]), 0.0) * b1[:, None]
    a22 = tl.where(low, _dot(k2, tl.trans(k2), IEEE=PREC) * tl.exp(g2[:, None] - g2[None, :]), 0.0) * b2[:, None]
    a33 = tl.where(low, _dot(k3, tl.trans(k3), IEEE=PREC) * tl.exp(g3[:, None] - g3[None, :]), 0.0) * b3[:, None]
    a10 = _dot(k1, tl.trans(k0), IEEE=PREC) * tl.exp(g1[:, None] - g0[None, :]) * b1[:, None]
    a20 = _dot(k2, tl.trans(k0), IEEE=PREC) * tl.exp(g2[:, None] - g0[None, :]) * b2[:, None]
    a21 = _dot(k2, tl.trans(k1), IEEE=PREC) * tl.exp(g2[:, None] - g1[None, :]) * b2[:, None]
    a30 = _dot(k3, tl.trans(k0), IEEE=PREC) * tl.exp(g3[:, None] - g0[None, :]) * b3[:, None]
    a31 = _dot(k3, tl.trans(k1), IEEE=PREC) * tl.exp(g3[:, None] - g1[None, :]) * b3[:, None]
    a32 = _dot(k3, tl.trans(k2), IEEE=PREC) * tl.exp(g3[:, None] - g2[None, :]) * b3[:, None]

    (t00, t10, t11, t20, t21, t22, t30, t31, t32, t33) = _solve_blocks(
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, o, SOLVE_POW, False)

    return (t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, g0, g1, g2, g3, b0, b1, b2, b3,
            k0, k1, k2, k3, kp, r0, r1, r2, r3, m0, m1, m2, m3, o, ok)


@triton.jit
def _program_chunk(coff_ptr, cu_ptr, N, HK: tl.constexpr, HV: tl.constexpr,
                   LOG_N: tl.constexpr):
    """A (chunk, value head) program's chunk c, heads hv / hk, its sequence's first row bos and
    length, and the chunk's first row t0 in it (c past the last chunk: the caller exits)."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    n, bos, length, t0 = block_bounds(coff_ptr, cu_ptr, c, N, LOG_N, BT)
    return c, hv, hv // (HV // HK), bos, length, t0


@triton.jit
def _wy_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, coff_ptr, G_ptr, w_ptr, u_ptr, N,
               HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               LOG_N: tl.constexpr, PREC: tl.constexpr, RELOAD_K: tl.constexpr = True,
               SOLVE_POW: tl.constexpr = False):
    c, hv, hk, bos, length, t0 = _program_chunk(coff_ptr, cu_ptr, N, HK, HV, LOG_N)
    if c >= tl.load(coff_ptr + N):
        return
    (t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, g0, g1, g2, g3, b0, b1, b2, b3,
     k0, k1, k2, k3, kp, r0, r1, r2, r3, m0, m1, m2, m3, o, ok) = _chunk_T(
        k_ptr, g_ptr, beta_ptr, G_ptr, bos, length, t0, hv, hk, HK, HV, K, PREC, SOLVE_POW)
    ov = tl.arange(0, V)
    dt = k_ptr.dtype.element_ty

    # W = T (beta e^G K), U = T (beta V), in the activations' dtype. RELOAD_K: the key tiles
    # are read again (L1 / L2 hits) instead of being held live across the solve (8 warps: 188
    # instead of 255 registers; 4 warps: 24 instead of 44 bytes spilled); the distinct cache
    # hint keeps the compiler from merging the two reads.
    if RELOAD_K:
        k0 = tl.load(kp + (bos + r0)[:, None] * (HK * K), mask=m0[:, None], other=0.0, cache_modifier=".ca")
        k1 = tl.load(kp + (bos + r1)[:, None] * (HK * K), mask=m1[:, None], other=0.0, cache_modifier=".ca")
        k2 = tl.load(kp + (bos + r2)[:, None] * (HK * K), mask=m2[:, None], other=0.0, cache_modifier=".ca")
        k3 = tl.load(kp + (bos + r3)[:, None] * (HK * K), mask=m3[:, None], other=0.0, cache_modifier=".ca")
    kw0 = (k0 * (b0 * tl.exp(g0))[:, None]).to(dt)
    kw1 = (k1 * (b1 * tl.exp(g1))[:, None]).to(dt)
    kw2 = (k2 * (b2 * tl.exp(g2))[:, None]).to(dt)
    kw3 = (k3 * (b3 * tl.exp(g3))[:, None]).to(dt)
    t00, t10, t11 = t00.to(dt), t10.to(dt), t11.to(dt)
    t20, t21, t22 = t20.to(dt), t21.to(dt), t22.to(dt)
    t30, t31, t32, t33 = t30.to(dt), t31.to(dt), t32.to(dt), t33.to(dt)
    wp = w_ptr + hv * K + ok[None, :]
    tl.store(wp + (bos + r0)[:, None] * (HV * K),
             _dot(t00, kw0, IEEE=PREC).to(dt), mask=m0[:, None])
    tl.store(wp + (bos + r1)[:, None] * (HV * K),
             _dot(t11, kw1, _dot(t10, kw0, IEEE=PREC),
                    IEEE=PREC).to(dt), mask=m1[:, None])
    acc = _dot(t21, kw1, _dot(t20, kw0, IEEE=PREC), IEEE=PREC)
    tl.store(wp + (bos + r2)[:, None] * (HV * K),
             _dot(t22, kw2, acc, IEEE=PREC).to(dt), mask=m2[:, None])
    acc = _dot(t31, kw1, _dot(t30, kw0, IEEE=PREC), IEEE=PREC)
    acc = _dot(t33, kw3, _dot(t32, kw2, acc, IEEE=PREC), IEEE=PREC)
    tl.store(wp + (bos + r3)[:, None] * (HV * K), acc.to(dt), mask=m3[:, None])

    vp = v_ptr + hv * V + ov[None, :]
    up = u_ptr + hv * V + ov[None, :]
    v0 = (tl.load(vp + (bos + r0)[:, None] * (HV * V), mask=m0[:, None], other=0.0) * b0[:, None]).to(dt)
    v1 = (tl.load(vp + (bos + r1)[:, None] * (HV * V), mask=m1[:, None], other=0.0) * b1[:, None]).to(dt)
    v2 = (tl.load(vp + (bos + r2)[:, None] * (HV * V), mask=m2[:, None], other=0.0) * b2[:, None]).to(dt)
    v3 = (tl.load(vp + (bos + r3)[:, None] * (HV * V), mask=m3[:, None], other=0.0) * b3[:, None]).to(dt)
    tl.store(up + (bos + r0)[:, None] * (HV * V),
             _dot(t00, v0, IEEE=PREC).to(dt), mask=m0[:, None])
    tl.store(up + (bos + r1)[:, None] * (HV * V),
             _dot(t11, v1, _dot(t10, v0, IEEE=PREC),
                    IEEE=PREC).to(dt), mask=m1[:, None])
    acc = _dot(t21, v1, _dot(t20, v0, IEEE=PREC), IEEE=PREC)
    tl.store(up + (bos + r2)[:, None] * (HV * V),
             _dot(t22, v2, acc, IEEE=PREC).to(dt), mask=m2[:, None])
    acc = _dot(t31, v1, _dot(t30, v0, IEEE=PREC), IEEE=PREC)
    acc = _dot(t33, v3, _dot(t32, v2, acc, IEEE=PREC), IEEE=PREC)
    tl.store(up + (bos + r3)[:, None] * (HV * V), acc.to(dt), mask=m3[:, None])


@triton.jit
def _wy_solve_kernel(k_ptr, g_ptr, beta_ptr, cu_ptr, coff_ptr, G_ptr, t_ptr, rk_ptr, N,
                     HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, LOG_N: tl.constexpr,
                     PREC: tl.constexpr, SOLVE_POW: tl.constexpr, BK: tl.constexpr = 32,
                     TF32: tl.constexpr = False, NORM: tl.constexpr = False):
    """"split" variant, first half: `_wy_kernel`'s G and T, T stored as a [64, 64] tile in the
    activations' dtype (its ten lower blocks; the six upper ones are never written: the apply
    kernel masks them), which is the precision the fused kernel's W / U products use too."""
    c, hv, hk, bos, length, t0 = _program_chunk(coff_ptr, cu_ptr, N, HK, HV, LOG_N)
    if c >= tl.load(coff_ptr + N):
        return
    o = tl.arange(0, BC)
    (g0, g1, g2, g3, b0, b1, b2, b3, r0, r1, r2, r3, m0, m1, m2, m3) = _chunk_gates(
        g_ptr, beta_ptr, G_ptr, bos, length, t0, hv, o, HV)
    # K K^T blocks over BK-column pieces of the keys (few live registers: the launch can be one
    # or two warps, whose solve reductions stay inside a warp)
    d00 = tl.zeros([BC, BC], dtype=tl.float32)
    d10 = tl.zeros([BC, BC], dtype=tl.float32)
    d11 = tl.zeros([BC, BC], dtype=tl.float32)
    d20 = tl.zeros([BC, BC], dtype=tl.float32)
    d21 = tl.zeros([BC, BC], dtype=tl.float32)
    d22 = tl.zeros([BC, BC], dtype=tl.float32)
    d30 = tl.zeros([BC, BC], dtype=tl.float32)
    d31 = tl.zeros([BC, BC], dtype=tl.float32)
    d32 = tl.zeros([BC, BC], dtype=tl.float32)
    d33 = tl.zeros([BC, BC], dtype=tl.float32)
    for kc in range(0, K, BK):
        kp = k_ptr + hk * K + kc + tl.arange(0, BK)[None, :]
        k0 = tl.load(kp + (bos + r0)[:, None] * (HK * K), mask=m0[:, None], other=0.0)
        k1 = tl.load(kp + (bos + r1)[:, None] * (HK * K), mask=m1[:, None], other=0.0)
        k2 = tl.load(kp + (bos + r2)[:, None] * (HK * K), mask=m2[:, None], other=0.0)
        k3 = tl.load(kp + (bos + r3)[:, None] * (HK * K), mask=m3[:, None], other=0.0)
        d00 = _dot(k0, tl.trans(k0), d00, IEEE=PREC)
        d10 = _dot(k1, tl.trans(k0), d10, IEEE=PREC)
        d11 = _dot(k1, tl.trans(k1), d11, IEEE=PREC)
        d20 = _dot(k2, tl.trans(k0), d20, IEEE=PREC)
        d21 = _dot(k2, tl.trans(k1), d21, IEEE=PREC)
        d22 = _dot(k2, tl.trans(k2), d22, IEEE=PREC)
        d30 = _dot(k3, tl.trans(k0), d30, IEEE=PREC)
        d31 = _dot(k3, tl.trans(k1), d31, IEEE=PREC)
        d32 = _dot(k3, tl.trans(k2), d32, IEEE=PREC)
        d33 = _dot(k3, tl.trans(k3), d33, IEEE=PREC)
    if NORM:  # L2-normalised keys: K K^T scaled by the rsqrt of its own diagonal
        eye = o[:, None] == o[None, :]
        n0r = tl.rsqrt(tl.sum(tl.where(eye, d00, 0.0), 1) + 1e-6)
        n1r = tl.rsqrt(tl.sum(tl.where(eye, d11, 0.0), 1) + 1e-6)
        n2r = tl.rsqrt(tl.sum(tl.where(eye, d22, 0.0), 1) + 1e-6)
        n3r = tl.rsqrt(tl.sum(tl.where(eye, d33, 0.0), 1) + 1e-6)
        n0c = tl.rsqrt(tl.sum(tl.where(eye, d00, 0.0), 0) + 1e-6)
        n1c = tl.rsqrt(tl.sum(tl.where(eye, d11, 0.0), 0) + 1e-6)
        n2c = tl.rsqrt(tl.sum(tl.where(eye, d22, 0.0), 0) + 1e-6)
        n3c = tl.rsqrt(tl.sum(tl.where(eye, d33, 0.0), 0) + 1e-6)
        d00 = d00 * n0r[:, None] * n0c[None, :]
        d11 = d11 * n1r[:, None] * n1c[None, :]
        d22 = d22 * n2r[:, None] * n2c[None, :]
        d33 = d33 * n3r[:, None] * n3c[None, :]
        d10 = d10 * n1r[:, None] * n0c[None, :]
        d20 = d20 * n2r[:, None] * n0c[None, :]
        d21 = d21 * n2r[:, None] * n1c[None, :]
        d30 = d30 * n3r[:, None] * n0c[None, :]
        d31 = d31 * n3r[:, None] * n1c[None, :]
        d32 = d32 * n3r[:, None] * n2c[None, :]
        if hv % (HV // HK) == 0:  # one of the value heads sharing the key head stores them
            tl.store(rk_ptr + (bos + r0) * HK + hk, n0r, mask=m0)
            tl.store(rk_ptr + (bos + r1) * HK + hk, n1r, mask=m1)
            tl.store(rk_ptr + (bos + r2) * HK + hk, n2r, mask=m2)
            tl.store(rk_ptr + (bos + r3) * HK + hk, n3r, mask=m3)
    low = o[:, None] > o[None, :]
    a00 = tl.where(low, d00 * tl.exp(g0[:, None] - g0[None, :]), 0.0) * b0[:, None]
    a11 = tl.where(low, d11 * tl.exp(g1[:, None] - g1[None, :]), 0.0) * b1[:, None]
    a22 = tl.where(low, d22 * tl.exp(g2[:, None] - g2[None, :]), 0.0) * b2[:, None]
    a33 = tl.where(low, d33 * tl.exp(g3[:, None] - g3[None, :]), 0.0) * b3[:, None]
    a10 = d10 * tl.exp(g1[:, None] - g0[None, :]) * b1[:, None]
    a20 = d20 * tl.exp(g2[:, None] - g0[None, :]) * b2[:, None]
    a21 = d21 * tl.exp(g2[:, None] - g1[None, :]) * b2[:, None]
    a30 = d30 * tl.exp(g3[:, None] - g0[None, :]) * b3[:, None]
    a31 = d31 * tl.exp(g3[:, None] - g1[None, :]) * b3[:, None]
    a32 = d32 * tl.exp(g3[:, None] - g2[None, :]) * b3[:, None]
    (t00, t10, t11, t20, t21, t22, t30, t31, t32, t33) = _solve_blocks(
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, o, SOLVE_POW, TF32 and not PREC)
    dt = k_ptr.dtype.element_ty
    tp = t_ptr + (c.to(tl.int64) * HV + hv) * (BT * BT) + o[:, None] * BT + o[None, :]
    tl.store(tp, t00.to(dt))
    tl.store(tp + BC * BT, t10.to(dt))
    tl.store(tp + BC * BT + BC, t11.to(dt))
    tl.store(tp + 2 * BC * BT, t20.to(dt))
    tl.store(tp + 2 * BC * BT + BC, t21.to(dt))
    tl.store(tp + 2 * BC * BT + 2 * BC, t22.to(dt))
    tl.store(tp + 3 * BC * BT, t30.to(dt))
    tl.store(tp + 3 * BC * BT + BC, t31.to(dt))
    tl.store(tp + 3 * BC * BT + 2 * BC, t32.to(dt))
    tl.store(tp + 3 * BC * BT + 3 * BC, t33.to(dt))


@triton.jit
def _wy_apply_chunk(c, hv, k_ptr, v_ptr, beta_ptr, G_ptr, t_ptr, w_ptr, u_ptr, rk_ptr, cu_ptr,
                    coff_ptr, N, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, LOG_N: tl.constexpr, PREC: tl.constexpr,
                    NORM: tl.constexpr):
    """W and U of chunk c, value head hv; returns the chunk's index inside its sequence."""
    bos, length, t0, ot, rows, m = _chunk_rows(coff_ptr, cu_ptr, c, N, LOG_N)
    hk = hv // (HV // HK)
    ok = tl.arange(0, K)
    ov = tl.arange(0, V)
    dt = k_ptr.dtype.element_ty
    lower = (ot[:, None] // BC) >= (ot[None, :] // BC)
    tt = tl.load(t_ptr + (c.to(tl.int64) * HV + hv) * (BT * BT) + ot[:, None] * BT + ot[None, :],
                 mask=lower, other=0.0)
    beta = tl.load(beta_ptr + rows * HV + hv, mask=m, other=0.0).to(tl.float32)
    G = tl.load(G_ptr + rows * HV + hv, mask=m, other=0.0)
    kk = tl.load(k_ptr + rows[:, None] * (HK * K) + hk * K + ok[None, :], mask=m[:, None],
                 other=0.0)
    scale_k = beta * tl.exp(G)
    if NORM:
        scale_k = scale_k * tl.load(rk_ptr + rows * HK + hk, mask=m, other=0.0)
    kw = (kk * scale_k[:, None]).to(dt)
    tl.store(w_ptr + rows[:, None] * (HV * K) + hv * K + ok[None, :],
             _dot(tt, kw, IEEE=PREC).to(dt), mask=m[:, None])
    vv = tl.load(v_ptr + rows[:, None] * (HV * V) + hv * V + ov[None, :], mask=m[:, None],
                 other=0.0)
    vb = (vv * beta[:, None]).to(dt)
    tl.store(u_ptr + rows[:, None] * (HV * V) + hv * V + ov[None, :],
             _dot(tt, vb, IEEE=PREC).to(dt), mask=m[:, None])
    return t0 // BT


@triton.jit
def _wy_apply_kernel(k_ptr, v_ptr, beta_ptr, G_ptr, t_ptr, w_ptr, u_ptr, rk_ptr, cu_ptr, coff_ptr,
                     wyflag_ptr, N, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, LOG_N: tl.constexpr, PREC: tl.constexpr,
                     NORM: tl.constexpr = False, SEG: tl.constexpr = 0, PDL: tl.constexpr = False):
    """"split" variant, second half: W = T (beta e^G K) and U = T (beta V) as 64-row products
    (wgmma on sm_90) from the stored T, one (chunk, value head) per program. SEG > 0 (overlap
    "all"): a persistent grid (one wave, so with PDL its dependent, the state kernel, launches
    at once) takes the (chunk, head) items in chunk-major order; once an item's W / U are stored,
    wyflags[first chunk of its SEG-chunk segment, head] += 1, which the state kernel waits for."""
    if PDL:
        gdc_launch_dependents()
    if SEG > 0:
        for item in range(tl.program_id(0), tl.load(coff_ptr + N) * HV, tl.num_programs(0)):
            c = item // HV
            hv = item % HV
            i = _wy_apply_chunk(c, hv, k_ptr, v_ptr, beta_ptr, G_ptr, t_ptr, w_ptr, u_ptr,
                                rk_ptr, cu_ptr, coff_ptr, N, HK, HV, K, V, LOG_N, PREC, NORM)
            _signal(wyflag_ptr + (c - i % SEG).to(tl.int64) * HV + hv, PDL)
    else:
        c = tl.program_id(0)
        if c < tl.load(coff_ptr + N):
            _wy_apply_chunk(c, tl.program_id(1), k_ptr, v_ptr, beta_ptr, G_ptr, t_ptr, w_ptr,
                            u_ptr, rk_ptr, cu_ptr, coff_ptr, N, HK, HV, K, V, LOG_N, PREC, NORM)


@triton.jit
def _signal(flag, CONCURRENT: tl.constexpr):
    """flag += 1 after every thread's earlier stores (a CTA barrier, then one thread's release
    add at GPU scope). CONCURRENT: the reader may run now (PDL): the barrier is inline PTX, since
    Triton's own barrier inside a loop stops its software pipelining of the loop's loads (the
    state kernel's 3 stages, 119 KB of shared memory on sm_90, drop to one, 28 KB); otherwise
    the reader runs after this grid (stream order) and the add alone does."""
    if CONCURRENT:
        tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
    tl.atomic_add(flag, 1, sem="release", scope="gpu")


@triton.jit
def _wait(flag, target):
    """Spin until flag >= target (one thread's acquire load; the barrier after it orders every
    thread's later loads)."""
    while tl.atomic_add(flag, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _state_step(i, h, k_ptr, w_ptr, u_ptr, G_ptr, h_ptr, vn_ptr, rk_ptr, flag_ptr, bos, length,
                c0, hv, hk, ot, ok, ov, sidx, HK: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, PREC: tl.constexpr, NORM: tl.constexpr,
                OVERLAP: tl.constexpr, PDL: tl.constexpr):
    """Chunk i of `_state_kernel`: store h, V' = U - W h, return the next chunk's h."""
    dt = k_ptr.dtype.element_ty
    rows = i * BT + ot
    m = rows < length
    if OVERLAP:
        if i > 0:  # chunk i - 1's stores, an iteration old: the release waits for little
            _signal(flag_ptr + (c0 + i - 1) * HV + hv, PDL)
    tl.store(h_ptr + ((c0 + i) * HV + hv) * K * V + sidx, h.to(dt))
    w = tl.load(w_ptr + (bos + rows)[:, None] * (HV * K) + hv * K + ok[None, :],
                mask=m[:, None], other=0.0)
    u = tl.load(u_ptr + (bos + rows)[:, None] * (HV * V) + hv * V + ov[None, :],
                mask=m[:, None], other=0.0)
    vn = u.to(tl.float32) - _dot(w, h.to(dt), IEEE=PREC)
    tl.store(vn_ptr + (bos + rows)[:, None] * (HV * V) + hv * V + ov[None, :], vn.to(dt),
             mask=m[:, None])
    G = tl.load(G_ptr + (bos + rows) * HV + hv, mask=m, other=0.0)
    last = tl.load(G_ptr + (bos + tl.minimum(i * BT + BT, length) - 1) * HV + hv)
    kk = tl.load(k_ptr + (bos + rows)[:, None] * (HK * K) + hk * K + ok[None, :],
                 mask=m[:, None], other=0.0)
    decay = tl.exp(last - G)
    if NORM:  # (the keys' rsqrt norms folded into V' rows: (diag(r) K)^T V' = K^T diag(r) V')
        decay = decay * tl.load(rk_ptr + (bos + rows) * HK + hk, mask=m, other=0.0)
    vs = tl.where(m[:, None], vn * decay[:, None], 0.0).to(dt)
    return h * tl.exp(last) + _dot(tl.trans(kk), vs, IEEE=PREC)


@triton.jit
def _state_kernel(k_ptr, w_ptr, u_ptr, G_ptr, h_ptr, vn_ptr, h0_ptr, ht_ptr, cu_ptr, coff_ptr,
                  rk_ptr, flag_ptr, wyflag_ptr, HK: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                  PREC: tl.constexpr, NORM: tl.constexpr = False, OVERLAP: tl.constexpr = False,
                  PDL: tl.constexpr = False, WAIT_SEG: tl.constexpr = 0):
    """The chunk-to-chunk state recurrence of one (sequence, value head, BV value columns): stores
    each chunk's start state (h, activations' dtype) and V' = U - W h; the final state in fp32.
    OVERLAP: once chunk c's h / V' are stored, flags[c, head] += 1 (release; at the start of the
    next chunk's step), so the output kernel, launched as a programmatic dependent (PDL: this
    grid lets it launch at once), runs chunk c while the recurrence goes on; the last chunk's
    flag follows the final-state store. WAIT_SEG > 0 (overlap "all": this grid is a programmatic
    dependent of the persistent W / U kernel, which runs on beside it): the chunks go in segments
    of WAIT_SEG, each started once the W / U kernel has counted all its chunks in
    wyflags[segment's first chunk, head] (a wait between, not inside, the software-pipelined
    chunk loops). Every wait is on a grid launched earlier, all of whose programs are resident
    or done by then (PDL's launch rule), and none of those waits on a later one: no deadlock,
    and without an early launch the grids simply run in order."""
    if PDL:
        gdc_launch_dependents()
    iv = tl.program_id(0)
    n = tl.program_id(1) // HV
    hv = tl.program_id(1) % HV
    hk = hv // (HV // HK)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    c0 = tl.load(coff_ptr + n).to(tl.int64)
    ot = tl.arange(0, BT)
    ok = tl.arange(0, K)
    ov = iv * BV + tl.arange(0, BV)
    sidx = ok[:, None] * V + ov[None, :]
    state_off = (n * HV + hv).to(tl.int64) * K * V
    if HAS_H0:
        h = tl.load(h0_ptr + state_off + sidx).to(tl.float32)
    else:
        h = tl.zeros([K, BV], dtype=tl.float32)
    nc = tl.cdiv(length, BT)
    if WAIT_SEG > 0:
        for first in range(0, nc, WAIT_SEG):
            stop = tl.minimum(first + WAIT_SEG, nc)
            _wait(wyflag_ptr + (c0 + first) * HV + hv, (stop - first).to(tl.int32))
            for i in range(first, stop):
                h = _state_step(i, h, k_ptr, w_ptr, u_ptr, G_ptr, h_ptr, vn_ptr, rk_ptr,
                                flag_ptr, bos, length, c0, hv, hk, ot, ok, ov, sidx, HK, HV, K,
                                V, PREC, NORM, OVERLAP, PDL)
    else:  # one flat loop: the nested form costs registers (sm_90: 181 vs 147 with OVERLAP)
        for i in range(nc):
            h = _state_step(i, h, k_ptr, w_ptr, u_ptr, G_ptr, h_ptr, vn_ptr, rk_ptr, flag_ptr,
                            bos, length, c0, hv, hk, ot, ok, ov, sidx, HK, HV, K, V, PREC, NORM,
                            OVERLAP, PDL)
    tl.store(ht_ptr + state_off + sidx, h)
    if OVERLAP:
        if nc > 0:  # (the output kernel's last chunk: after everything this program stores)
            _signal(flag_ptr + (c0 + nc - 1) * HV + hv, PDL)


@triton.jit
def _output_kernel(q_ptr, k_ptr, vn_ptr, h_ptr, G_ptr, o_ptr, cu_ptr, coff_ptr, rk_ptr, flag_ptr,
                   N, scale, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, LOG_N: tl.constexpr, PREC: tl.constexpr,
                   BV: tl.constexpr = None, NORM: tl.constexpr = False,
                   OVERLAP: tl.constexpr = 0):
    # BV < V: V // BV programs per (chunk, head), adjacent in launch order (they share the
    # chunk's q / k through L2), each recomputing the [64, 64] Q K^T for its value columns.
    # OVERLAP > 0 (the state kernel's programs per head): a 1-D grid in chunk-major order, each
    # program waiting for its chunk's flag to reach OVERLAP before reading h / V'
    NVB: tl.constexpr = V // BV
    if OVERLAP > 0:
        c = tl.program_id(0) // (NVB * HV)
        hv = tl.program_id(0) // NVB % HV
    else:
        c = tl.program_id(0) // NVB
        hv = tl.program_id(1)
    iv = tl.program_id(0) % NVB
    if c >= tl.load(coff_ptr + N):
        return
    bos, length, t0, ot, rows, m = _chunk_rows(coff_ptr, cu_ptr, c, N, LOG_N)
    hk = hv // (HV // HK)
    ok = tl.arange(0, K)
    ov = iv * BV + tl.arange(0, BV)
    dt = q_ptr.dtype.element_ty
    q = tl.load(q_ptr + rows[:, None] * (HK * K) + hk * K + ok[None, :], mask=m[:, None], other=0.0)
    kk = tl.load(k_ptr + rows[:, None] * (HK * K) + hk * K + ok[None, :], mask=m[:, None], other=0.0)
    G = tl.load(G_ptr + rows * HV + hv, mask=m, other=0.0)
    if OVERLAP > 0:
        _wait(flag_ptr + c.to(tl.int64) * HV + hv, OVERLAP)
    h = tl.load(h_ptr + (c.to(tl.int64) * HV + hv) * K * V + ok[:, None] * V + ov[None, :])
    vn = tl.load(vn_ptr + rows[:, None] * (HV * V) + hv * V + ov[None, :], mask=m[:, None], other=0.0)
    eg = tl.exp(G)
    if NORM:  # L2-normalised q and k: their rsqrt norms scale the products' rows / columns
        qf = q.to(tl.float32)
        rq = tl.rsqrt(tl.sum(qf * qf, 1) + 1e-6)
        eg = eg * rq
    inter = _dot(q, h, IEEE=PREC) * eg[:, None]
    qk = _dot(q, tl.trans(kk), IEEE=PREC)
    if NORM:
        qk = qk * rq[:, None] * tl.load(rk_ptr + rows * HK + hk, mask=m, other=0.0)[None, :]
    causal = (ot[:, None] >= ot[None, :]) & m[None, :]
    qk = tl.where(causal, qk * tl.exp(G[:, None] - G[None, :]), 0.0)
    out = (inter + _dot(qk.to(dt), vn, IEEE=PREC)) * scale
    tl.store(o_ptr + rows[:, None] * (HV * V) + hv * V + ov[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m[:, None])


@triton.jit
def _l2norm_kernel(x_ptr, y_ptr, x2_ptr, y2_ptr, rows, D: tl.constexpr, ROWS: tl.constexpr):
    """y = x / sqrt(sum(x^2) + 1e-6) per row of length D (q and k of Qwen3-Next's GDN); a
    second program column (grid axis 1) does x2 -> y2 (k with q: one launch)."""
    if tl.program_id(1) == 1:
        x_ptr, y_ptr = x2_ptr, y2_ptr
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    m = r < rows
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * D + cols[None, :], mask=m[:, None],
                other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + r[:, None].to(tl.int64) * D + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=m[:, None])


NORM_ROWS = 64  # rows per program of the L2 norm (16 took 32 us per tensor at T = 16k)


def l2norm(x: torch.Tensor, x2: torch.Tensor | None = None, rows_per_program: int = NORM_ROWS):
    """Row-wise L2 normalisation of a contiguous [..., D] tensor (D a power of two); with x2
    (same shape), both in one launch and a pair back."""
    d = x.shape[-1]
    y = torch.empty_like(x)
    y2 = None if x2 is None else torch.empty_like(x2)
    if x2 is not None and x2.shape != x.shape:
        raise ValueError(f"l2norm: x2 {tuple(x2.shape)} differs from x {tuple(x.shape)}")
    rows = x.numel() // d
    if rows:
        pair = x2 is not None
        _l2norm_kernel[(triton.cdiv(rows, rows_per_program), 2 if pair else 1)](
            x, y, x2 if pair else x, y2 if pair else y, rows, D=d, ROWS=rows_per_program,
            num_warps=4)
    return y if x2 is None else (y, y2)


def _timed_target(device: torch.device) -> bool:
    """OUTPUT_TARGETS with PDL: where the plain call's launch forms were timed (not the
    interpreter, ROCm, pre-sm_90 or the compile-verified targets)."""
    return pdl.supported(device) and platform_of(device).target in OUTPUT_TARGETS


def _default_overlap(device: torch.device):
    """A plain call's overlap: DEFAULT_OVERLAP where it was timed, else none."""
    return DEFAULT_OVERLAP if _timed_target(device) else False


def _launch_rule(device: torch.device, num_seqs: int, hv: int, dv: int) -> dict:
    """A plain call's state columns and norm where they were timed (see STATE_BV), from the
    shapes alone (no host sync); {} elsewhere (the kernels' defaults)."""
    if not _timed_target(device):
        return {}
    sms = platform_of(device).num_sms or 0
    bv = min(dv, STATE_BV)
    if num_seqs * hv * (dv // bv) > sms and dv % STATE_BV_WIDE == 0:
        bv = STATE_BV_WIDE
    return {"state_bv": bv, "norm": "fused" if num_seqs * hv * (dv // bv) <= sms else "launch"}


def _prec(dtype: torch.dtype) -> bool:
    # fp32 activations keep fp32 products (ieee); fp16 / bf16 tiles multiply natively
    return dtype == torch.float32


# AMD CDNA (wave 64) launches per arch: heuristic, not run (no AMD GPU); the compile matrix
# shows MFMA, no scratch and LDS within the arch for each (tests/compile/resources.json). The
# NVIDIA launches above are the run-verified ones and stay as they are.
CDNA_ARCHS = ("gfx942", "gfx950")
# state kernel (value columns, stages). 16 columns: Qwen3-Next's 32 value heads x 128 values
# make 256 programs a sequence (32 columns: 128) for MI300X's 304 / MI355X's 256 CUs, on a
# chain of chunks that is serial within a program. Stages: gfx942 keeps one W / K prefetch
# buffer (2 stages, 36 KB of its 64 KB of LDS; the NVIDIA launch's 3 stages at 32 columns took
# 72 KB), gfx950 two (3 stages, 68 KB of 160 KB)
CDNA_STATE = {"gfx942": (16, 2), "gfx950": (16, 3)}
# WY and state kernels: 16 x 16 MFMA (the WY solve's sub-blocks are 16 rows; 16 value
# columns in the state kernel). The WY kernel keeps 4 waves (one per SIMD of a CU; 2 waves
# saved 4 of 248 VGPRs) and the output kernel 8 at V >= 128 (4 waves, NVIDIA's launch since
# session 20, took 327 VGPRs: one wave per SIMD; 8: 232) with the compiler's 32 x 32 MFMA for
# its 64 x 128 tiles
CDNA_OPTIONS = {"matrix_instr_nonkdim": 16}
_arch: dict[torch.device, str | None] = {}


def cdna_arch(device: torch.device) -> str | None:
    """"gfx942" / "gfx950" on those AMD GPUs (their own launches above), else None."""
    if device.type != "cuda" or torch.version.hip is None:
        return None
    if device not in _arch:
        arch = platform_of(device).arch
        _arch[device] = arch if arch in CDNA_ARCHS else None
    return _arch[device]


@register("gdn", "chunk_prefill", **TRITON, formats=FORMATS,
          traits={"head_dim_k": head_dim_ok, "head_dim_v": head_dim_ok},
          tags=("deterministic", "throughput"), compile_cases=lambda: _cases())
def chunk_prefill(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None,
                  chunk_size=64, use_qk_l2norm=False, tuning: dict | None = None):
    """Triton chunked gated delta rule (WY / UT form, chunk 64, fp32 state).

    tuning: launch overrides for measurements ({"variant": "fused" / "wy64" (the WY kernel,
    default DEFAULT_VARIANT), "wy_solve": "subst" / "pow" (the fused WY kernel's diagonal
    solve, default DEFAULT_SOLVE), "state_bv", "state_stages", "wy_warps", "wy_reload",
    "wy_diag_x4", "wy_cols" (wy64), "wy_apply_warps" / "wy_bk" / "wy_tf32" (split: the merge
    products on tf32 tensor cores), "norm": "launch" / "fused" (split only: q / k L2 norm inside
    the kernels), "overlap": False / True or "output" / "all" (see OVERLAPS), "overlap_seg",
    "apply_per_sm", "apply_maxnreg" (overlap "all": the state kernel's wait granularity in chunks,
    the persistent W / U grid and its register cap), "overlap_pdl": False (the overlapped forms'
    kernels launched in plain stream order: the same arithmetic, nothing concurrent),
    "out_warps", "out_bv" (the output kernel's value columns per program), "norm_rows"})."""
    tuning = tuning or _tune.chunk_config(q.shape[0], cu_seqlens.shape[0] - 1, q.shape[1],
                                          v.shape[1], q.shape[2], v.shape[2], q.dtype,
                                          q.device)
    arch = cdna_arch(q.device)
    # (CDNA keeps the fused WY kernel: the compile matrix builds the split pair for NVIDIA only)
    variant = tuning.get("variant", "fused" if arch else DEFAULT_VARIANT)
    if variant not in VARIANTS:
        raise ValueError(f"tuning: expected variant in {VARIANTS}, got {variant!r}")
    solve = tuning.get("wy_solve", DEFAULT_SOLVE)
    if solve not in SOLVES:
        raise ValueError(f"tuning: expected wy_solve in {SOLVES}, got {solve!r}")
    total, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    num_seqs = cu_seqlens.shape[0] - 1
    dev = q.device
    scale = dk ** -0.5 if scale is None else float(scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous().float()
    beta = beta.contiguous()
    rule = _launch_rule(q.device, num_seqs, hv, dv)
    norm = tuning.get("norm", rule.get("norm", DEFAULT_NORM))
    if norm not in NORMS:
        raise ValueError(f"tuning: expected norm in {NORMS}, got {norm!r}")
    # "fused": the split pipeline normalises q / k inside its kernels (the solve kernel stores the
    # keys' rsqrt norms, [T, HK] fp32); the other WY variants take the separate launch
    fuse_norm = use_qk_l2norm and norm == "fused" and variant == "split"
    if use_qk_l2norm and not fuse_norm:
        q, k = l2norm(q, k, tuning.get("norm_rows", NORM_ROWS))
    overlap = tuning["overlap"] if "overlap" in tuning else _default_overlap(q.device)
    overlap = "output" if overlap is True else overlap
    if overlap not in OVERLAPS:
        raise ValueError(f"tuning: expected overlap in {OVERLAPS} or True, got {overlap!r}")
    if overlap == "all" and variant != "split":
        raise ValueError("tuning: overlap 'all' needs the split variant (its W / U kernel)")
    # (overlap "all" only: the device's compile target and SM count)
    plat = platform_of(q.device) if overlap == "all" else None
    if plat is not None and q.device.type == "cuda" and plat.target not in ALL_TARGETS:
        raise ValueError(f"tuning: overlap 'all' is built for {ALL_TARGETS} only")
    seg = int(tuning.get("overlap_seg", OVERLAP_SEG))
    if seg < 1:
        raise ValueError(f"tuning: overlap_seg must be >= 1, got {seg}")
    cu = cu_seqlens.to(torch.int32).contiguous()
    coff = block_offsets(cu, CHUNK)
    max_chunks = total // CHUNK + num_seqs
    # overlap: per-(chunk, head) counters (the state programs past a chunk; the W / U items of a
    # segment), zeroed here. Without PDL (interpreter, pre-sm_90, ROCm) the grids run in stream
    # order and every wait finds its count reached
    overlap = overlap if max_chunks else False
    use_pdl = bool(overlap) and pdl.supported(dev) and bool(tuning.get("overlap_pdl", True))
    flags = torch.zeros(2, max_chunks * hv, dtype=torch.int32, device=dev) if overlap else None
    flags, wyflags = (flags[0], flags[1]) if overlap else (cu, cu)
    dt = q.dtype
    G = torch.empty(total, hv, dtype=torch.float32, device=dev)
    rk = torch.empty(total, hk, dtype=torch.float32, device=dev) if fuse_norm else G
    w = torch.empty(total, hv, dk, dtype=dt, device=dev)
    u = torch.empty(total, hv, dv, dtype=dt, device=dev)
    o = torch.empty(total, hv, dv, dtype=dt, device=dev)
    final = torch.empty(num_seqs, hv, dk, dv, dtype=torch.float32, device=dev)
    log_n = search_steps(num_seqs)
    prec = _prec(dt)
    # (before the W / U launch: with overlap "all" the state kernel is its programmatic dependent,
    # so no other kernel may come between them)
    h0 = initial_state.contiguous().float() if initial_state is not None else final
    amd = dict(CDNA_OPTIONS) if arch else {}
    if max_chunks and variant == "wy64":
        # fp32 scratch for A, then T, one [64, 64] tile per (chunk, head); see _wy64.py
        scratch = torch.empty(max_chunks, hv, CHUNK, CHUNK, dtype=torch.float32, device=dev)
        _wy64_kernel[(max_chunks, hv)](k, v, g, beta, cu, coff, G, scratch, w, u, num_seqs,
                                       HK=hk, HV=hv, K=dk, V=dv, LOG_N=log_n, PREC=prec,
                                       RELOAD_K=tuning.get("wy_reload", True),
                                       DIAG_X4=tuning.get("wy_diag_x4", True),
                                       KC=min(dk, tuning.get("wy_cols", WY64_COLS)),
                                       VC=min(dv, tuning.get("wy_cols", WY64_COLS)),
                                       num_warps=tuning.get("wy_warps", WY64_WARPS), **amd)
        del scratch
    elif max_chunks and variant == "split":
        tbuf = torch.empty(max_chunks, hv, CHUNK, CHUNK, dtype=dt, device=dev)
        _wy_solve_kernel[(max_chunks, hv)](k, g, beta, cu, coff, G, tbuf, rk, num_seqs, HK=hk,
                                           HV=hv, K=dk, LOG_N=log_n, PREC=prec, NORM=fuse_norm,
                                           SOLVE_POW=solve == "pow",
                                           BK=min(dk, tuning.get("wy_bk", SPLIT_BK)),
                                           TF32=tuning.get("wy_tf32", SPLIT_TF32),
                                           num_warps=tuning.get("wy_warps", SPLIT_WARPS), **amd)
        apply_args = (k, v, beta, G, tbuf, w, u, rk, cu, coff, wyflags, num_seqs)
        apply_kw = dict(HK=hk, HV=hv, K=dk, V=dv, LOG_N=log_n, PREC=prec, NORM=fuse_norm,
                        num_warps=tuning.get("wy_apply_warps", 4), **amd)
        if overlap == "all":
            sms = plat.num_sms or 4  # (the CPU interpreter: any small grid)
            progs = min(max_chunks * hv, sms * tuning.get("apply_per_sm", APPLY_PER_SM))
            _wy_apply_kernel[(progs,)](*apply_args, SEG=seg, PDL=use_pdl, **apply_kw,
                                       **({"maxnreg": tuning["apply_maxnreg"]}
                                          if "apply_maxnreg" in tuning else {}))
        else:
            _wy_apply_kernel[(max_chunks, hv)](*apply_args, **apply_kw)
            del tbuf  # (with "all" it lives on: the apply kernel still reads it as later ones run)
    elif max_chunks:
        _wy_kernel[(max_chunks, hv)](k, v, g, beta, cu, coff, G, w, u, num_seqs, HK=hk, HV=hv,
                                     K=dk, V=dv, LOG_N=log_n, PREC=prec,
                                     RELOAD_K=tuning.get("wy_reload", dk >= 128),
                                     SOLVE_POW=solve == "pow",
                                     num_warps=tuning.get("wy_warps", 4), **amd)
    state_bv, state_stages = CDNA_STATE[arch] if arch else (rule.get("state_bv", STATE_BV), None)
    bv = min(dv, tuning.get("state_bv", state_bv))
    stages = {"num_stages": state_stages, **amd} if arch else {}
    if "state_stages" in tuning:
        stages["num_stages"] = tuning["state_stages"]
    elif overlap == "output" and not arch:
        stages["num_stages"] = OVERLAP_STATE_STAGES
    # (CDNA keeps 8 waves at V >= 128: 4 took 327 VGPRs, one wave per SIMD; see CDNA_OPTIONS)
    out_warps = tuning.get("out_warps", 8 if arch and dv >= 128 else OUT_WARPS)
    vn = torch.empty(total, hv, dv, dtype=dt, device=dev)
    h = torch.empty(max_chunks, hv, dk, dv, dtype=dt, device=dev)
    _state_kernel[(dv // bv, num_seqs * hv)](k, w, u, G, h, vn, h0, final, cu, coff, rk, flags,
                                             wyflags, HK=hk, HV=hv, K=dk, V=dv, BV=bv,
                                             HAS_H0=initial_state is not None, PREC=prec,
                                             NORM=fuse_norm, OVERLAP=bool(overlap), PDL=use_pdl,
                                             WAIT_SEG=seg if overlap == "all" else 0,
                                             num_warps=4, **stages,
                                             **({"launch_pdl": True}
                                                if use_pdl and overlap == "all" else {}))
    if max_chunks:
        obv = min(dv, tuning.get("out_bv", OUT_BV))
        nvb = dv // obv
        grid = (max_chunks * nvb * hv,) if overlap else (max_chunks * nvb, hv)
        _output_kernel[grid](q, k, vn, h, G, o, cu, coff, rk, flags, num_seqs, scale, HK=hk,
                             HV=hv, K=dk, V=dv, LOG_N=log_n, PREC=prec, BV=obv, NORM=fuse_norm,
                             OVERLAP=dv // bv if overlap else 0, num_warps=out_warps,
                             **({"launch_pdl": True} if use_pdl else {}))
    return o, final


def _cases():
    common = {"cu_ptr": "*i32", "coff_ptr": "*i32"}
    wy = {"k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*bf16",
          **common, "G_ptr": "*fp32", "w_ptr": "*bf16", "u_ptr": "*bf16", "N": "i32"}
    wy64 = {a: wy[a] for a in ("k_ptr", "v_ptr", "g_ptr", "beta_ptr", "cu_ptr", "coff_ptr",
                               "G_ptr")}
    wy64.update(a_ptr="*fp32", w_ptr="*bf16", u_ptr="*bf16", N="i32")
    solve = {"k_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*bf16", **common, "G_ptr": "*fp32",
             "t_ptr": "*bf16", "rk_ptr": "*fp32", "N": "i32"}
    apply = {"k_ptr": "*bf16", "v_ptr": "*bf16", "beta_ptr": "*bf16", "G_ptr": "*fp32",
             "t_ptr": "*bf16", "w_ptr": "*bf16", "u_ptr": "*bf16", "rk_ptr": "*fp32", **common,
             "wyflag_ptr": "*i32", "N": "i32"}
    st = {"k_ptr": "*bf16", "w_ptr": "*bf16", "u_ptr": "*bf16", "G_ptr": "*fp32",
          "h_ptr": "*bf16", "vn_ptr": "*bf16", "h0_ptr": "*fp32", "ht_ptr": "*fp32", **common,
          "rk_ptr": "*fp32", "flag_ptr": "*i32", "wyflag_ptr": "*i32"}
    out_sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "vn_ptr": "*bf16", "h_ptr": "*bf16",
           "G_ptr": "*fp32", "o_ptr": "*bf16", **common, "rk_ptr": "*fp32", "flag_ptr": "*i32",
           "N": "i32", "scale": "fp32"}
    heads = dict(HK=16, HV=32, K=128, V=128, PREC=False)
    nvidia_cases = [
        # 16-row sub-blocks: below wgmma's M = 64, so warp-level mma on sm_90 / sm_100
        # 4 warps (two programs per SM) with the key reload: 24 bytes spilled on sm_90 and
        # 1.37x faster than the spill-free 8-warp launch (benchmarks/RESULTS.md, issue 23)
        CompileCase(_wy_kernel, wy, dict(heads, LOG_N=4, RELOAD_K=True, SOLVE_POW=True),
                    num_warps=4, uses_dot=True, narrow_dot=True, label="wy"),
        # the "wy64" variant: K K^T, W and U as 64-row products (wgmma on sm_90). sm_90, no
        # spill: 8 warps 170 registers with the [4, 16, 16] diagonal solve, 128 without (two
        # CTAs per SM); 4 warps 255 / 252
        CompileCase(_wy64_kernel, wy64, dict(heads, LOG_N=4, RELOAD_K=True, DIAG_X4=True,
                                             KC=WY64_COLS, VC=WY64_COLS),
                    num_warps=WY64_WARPS, uses_dot=True, label="wy64"),
        CompileCase(_state_kernel, st, dict(heads, BV=32, HAS_H0=True, NORM=False,
                                            OVERLAP=False, PDL=False, WAIT_SEG=0),
                    num_warps=4,
                    uses_dot=True, label="state"),
        CompileCase(_output_kernel, out_sig, dict(heads, LOG_N=4, BV=OUT_BV, NORM=False,
                                                  OVERLAP=0),
                    num_warps=OUT_WARPS,
                    uses_dot=True, label="output"),
        # the "split" variant's two halves (T through memory; W / U as 64-row products)
        CompileCase(_wy_solve_kernel, solve, dict(HK=16, HV=32, K=128, PREC=False, LOG_N=4,
                                                   SOLVE_POW=True, BK=SPLIT_BK, TF32=SPLIT_TF32,
                                                   NORM=False),
                    num_warps=SPLIT_WARPS, uses_dot=True, narrow_dot=True, label="wy_solve"),
        CompileCase(_wy_apply_kernel, apply, dict(heads, LOG_N=4, NORM=False, SEG=0, PDL=False),
                    num_warps=4, uses_dot=True, label="wy_apply"),
        CompileCase(_l2norm_kernel, {"x_ptr": "*bf16", "y_ptr": "*bf16", "x2_ptr": "*bf16",
                                     "y2_ptr": "*bf16", "rows": "i32"},
                    dict(D=128, ROWS=NORM_ROWS), num_warps=4, label="l2norm"),
    ]
    # the dot cases above are the NVIDIA launches; CDNA builds its own (chunk_prefill on
    # gfx942 / gfx950)
    nvidia = tuple(t for t in TRITON["compiled"] if t.startswith("sm_"))
    out = [dataclasses.replace(c, targets=nvidia) if c.uses_dot else c for c in nvidia_cases]
    # tuning overlap: the flagged state kernel (a PDL trigger; waiting for W / U segments with
    # "all"), the waiting output kernel, the persistent flagged W / U kernel
    out += [CompileCase(_state_kernel, st, dict(heads, BV=32, HAS_H0=True, NORM=False,
                                                OVERLAP=True, PDL=True, WAIT_SEG=0),
                        num_warps=4, num_stages=OVERLAP_STATE_STAGES, uses_dot=True,
                        label="state_overlap", targets=pdl.TARGETS),
            CompileCase(_state_kernel, st, dict(heads, BV=32, HAS_H0=True, NORM=False,
                                                OVERLAP=True, PDL=True, WAIT_SEG=OVERLAP_SEG),
                        num_warps=4, uses_dot=True, label="state_overlap_all",
                        targets=ALL_TARGETS),
            CompileCase(_wy_apply_kernel, apply, dict(heads, LOG_N=4, NORM=False,
                                                      SEG=OVERLAP_SEG, PDL=True),
                        num_warps=4, uses_dot=True, label="wy_apply_overlap_all",
                        targets=ALL_TARGETS),
            CompileCase(_output_kernel, out_sig, dict(heads, LOG_N=4, BV=OUT_BV, NORM=False,
                                                         OVERLAP=4),
                        num_warps=OUT_WARPS, uses_dot=True, label="output_overlap",
                        targets=pdl.TARGETS)]
    # _launch_rule's launches on sm_90: one sequence (a state grid within the SMs) takes the
    # fused q / k norm in all four kernels; many take STATE_BV_WIDE columns with the norm launch
    out += [CompileCase(_wy_solve_kernel, solve, dict(HK=16, HV=32, K=128, PREC=False, LOG_N=4,
                                                       SOLVE_POW=True, BK=SPLIT_BK,
                                                       TF32=SPLIT_TF32, NORM=True),
                        num_warps=SPLIT_WARPS, uses_dot=True, narrow_dot=True,
                        label="wy_solve_norm", targets=nvidia),
            CompileCase(_wy_apply_kernel, apply, dict(heads, LOG_N=4, NORM=True, SEG=0,
                                                      PDL=False),
                        num_warps=4, uses_dot=True, label="wy_apply_norm", targets=nvidia),
            CompileCase(_state_kernel, st, dict(heads, BV=STATE_BV, HAS_H0=True, NORM=True,
                                                OVERLAP=True, PDL=True, WAIT_SEG=0),
                        num_warps=4, num_stages=OVERLAP_STATE_STAGES, uses_dot=True,
                        label="state_overlap_norm", targets=pdl.TARGETS),
            CompileCase(_state_kernel, st, dict(heads, BV=STATE_BV_WIDE, HAS_H0=True,
                                                NORM=False, OVERLAP=True, PDL=True, WAIT_SEG=0),
                        num_warps=4, num_stages=OVERLAP_STATE_STAGES, uses_dot=True,
                        label="state_overlap_wide", targets=pdl.TARGETS),
            CompileCase(_output_kernel, out_sig, dict(heads, LOG_N=4, BV=OUT_BV, NORM=True,
                                                         OVERLAP=128 // STATE_BV),
                        num_warps=OUT_WARPS, uses_dot=True, label="output_overlap_norm",
                        targets=pdl.TARGETS)]
    opts = tuple(CDNA_OPTIONS.items())
    for arch in CDNA_ARCHS:
        bv, ns = CDNA_STATE[arch]
        wy, _, st, o = nvidia_cases[:4]
        # (WY / output: AMD's default 2 stages, as launched; neither has a pipelined loop)
        out += [dataclasses.replace(wy, targets=(arch,), num_stages=2, options=opts,
                                    label=f"wy_{arch}"),
                dataclasses.replace(st, constexprs=dict(st.constexprs, BV=bv), num_stages=ns,
                                    targets=(arch,), options=opts, label=f"state_{arch}"),
                dataclasses.replace(o, targets=(arch,), num_stages=2, num_warps=8,
                                    label=f"output_{arch}")]
    return out
