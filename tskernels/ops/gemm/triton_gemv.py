"""Weight-streaming GEMM for decode rows (M <= 64): bf16/fp16 `gemv` and the small-M path of
block-fp8 `fp8_block_mm`.

A decode GEMM reads every weight byte once and does a few FLOPs per byte, so what matters is
keeping enough weight bytes in flight on every SM. The kernel computes the transposed product
c.T [BN, MP] = w_tile [BN, BK] @ x_tile.T [BK, MP] so the weight tile is the MMA's M side
(64 rows: one wgmma on Hopper) and the few activation rows (padded to MP = 16/32/64) are its
N side; the weight tiles stream through a cp.async / TMA-style software pipeline.

When N alone gives too few programs (a 4096-row projection is 64 tiles of 64 rows on 132
SMs) the K range is split over a second grid axis. The partial sums are added with fp32
atomics into a per-device workspace; the program that arrives last at a tile (a per-tile
arrival counter) takes the sum with an atomic exchange against zero (so its slice of the
workspace is clean again), resets the counter, applies the epilogue (optional residual add,
dtype cast) and writes c. One kernel launch, no host sync, graph-capturable. Because the fp32
partials are added in arrival order, split launches are not bitwise deterministic run to run
(the splits round identically; only the order of a handful of fp32 adds varies).

On sm_90+ CUDA the 16-bit launches are programmatic dependent launches (the grid is scheduled
while the previous kernel drains, and waits for it before its first load); a few (N, K) take a
per-shape split target measured on the H200 (SHAPE_CONFIGS). With PREFETCH_TILES > 0 they go
through _stream_early_kernel, which asks L2 for its first weight tiles before that wait.

The workspace is shared by every call on a device: calls that run *concurrently* on two
streams of one device must not both split (the engines we serve run one stream per device).
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from autotune import backend_options

from ...compile import CompileCase
from ..shared.pdl import prefetch_l2
from ..shared.persist import cta_sync, resident_programs
from . import _tune

MAX_M = 64
# fp32 workspace elements and arrival counters kept per device (16 MiB / 256 KiB)
WS_ELEMS = 1 << 22
CNT_ELEMS = 1 << 16


@triton.jit
def _stream_kernel(w_ptr, x_ptr, c_ptr, r_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr,
                   M, N, K, stride_w, stride_x, stride_c, stride_r, stride_as, stride_bs,
                   K_SPLIT,
                   BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr, BLOCK: tl.constexpr,
                   SPLIT: tl.constexpr, FP8: tl.constexpr, HAS_RES: tl.constexpr,
                   EVEN_K: tl.constexpr, PDL: tl.constexpr = False):
    """c[:M, n-tile] = x[:M] @ w[n-tile].T (+ r), over K range [pid_k * K_SPLIT, +K_SPLIT).

    w [N, K], x [M, K] (row-major in K). FP8: w, x float8 e4m3 with scales
    bs[n // BLOCK, k // BLOCK], as[m, k // BLOCK] (BK == BLOCK, BN divides BLOCK).
    SPLIT: K is split over program_id(1); partials meet in ws (fp32 [M, N]) and cnt.
    PDL: launched as a programmatic dependent of the previous kernel (sm_90+): the grid is
    scheduled while that kernel drains and waits for its completion and memory here, before
    any load or store; it lets the next programmatic dependent launch at once in turn.
    """
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, MP)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(K, k0 + K_SPLIT)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + offs_m[:, None] * stride_x
    acc = tl.zeros((BN, MP), dtype=tl.float32)
    for k in range(k0, k1, BK):
        offs_k = k + tl.arange(0, BK)
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None], other=0.0,
                        eviction_policy="evict_last")
        else:
            k_mask = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0, eviction_policy="evict_first")
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                        other=0.0, eviction_policy="evict_last")
        if FP8:
            kb = k // BLOCK
            b_s = tl.load(bs_ptr + ((pid_n * BN) // BLOCK) * stride_bs + kb)
            a_s = tl.load(as_ptr + offs_m * stride_as + kb, mask=m_mask, other=0.0)
            acc += tl.dot(w, tl.trans(x)) * (a_s * b_s)[None, :]
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    mask2 = n_mask[:, None] & m_mask[None, :]
    if SPLIT:
        tile = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.atomic_add(tile, acc, mask=mask2, sem="relaxed")
        # every thread's adds happen-before the counter's release (CTA barrier, then one
        # acq_rel atomic at GPU scope); the last arrival acquires all of them
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) - 1:
            # read and re-zero in one L2 atomic: a load and a zeroing store would be issued
            # by different threads of this program (different layouts) and could cross
            # (on the int32 view of the bits: the interpreter exchanges integers only)
            bits = ws_ptr.to(tl.pointer_type(tl.int32)) + offs_m[None, :] * N + offs_n[:, None]
            acc = tl.atomic_xchg(bits, tl.zeros((BN, MP), dtype=tl.int32), mask=mask2,
                                 sem="relaxed").to(tl.float32, bitcast=True)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            _epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, HAS_RES)
    else:
        _epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, HAS_RES)


@triton.jit
def _stream_early_kernel(w_ptr, x_ptr, c_ptr, r_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr,
                         M, N, K, stride_w, stride_x, stride_c, stride_r, stride_as,
                         stride_bs, K_SPLIT,
                         BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                         BLOCK: tl.constexpr, SPLIT: tl.constexpr, FP8: tl.constexpr,
                         HAS_RES: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
                         PREFETCH: tl.constexpr):
    """_stream_kernel as a programmatic dependent that streams weights before its wait: it
    lets its own dependents launch at once, asks L2 for the first PREFETCH weight tiles of its
    rows and K range (prefetch.global.L2: no registers, no shared memory, nothing to wait
    for), then waits for the previous kernel (x, the residual and the split workspace may be
    its outputs or still in its use) and runs the unchanged streaming loop, whose first loads
    then hit L2. Weights are never written by a kernel of the step. PREFETCH 0: only the
    trigger moves before the wait. PDL False (the interpreter): _stream_kernel itself."""
    if PDL:
        gdc_launch_dependents()
        if PREFETCH > 0:
            LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # 128 B
            offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
            k0 = tl.program_id(1) * K_SPLIT
            cols = k0 + tl.arange(0, PREFETCH * BK // LINE) * LINE
            prefetch_l2(w_ptr + offs_n.to(tl.int64)[:, None] * stride_w + cols[None, :],
                        (offs_n < N)[:, None] & (cols < tl.minimum(K, k0 + K_SPLIT))[None, :])
        gdc_wait()
    # the tuned tables key on _stream_kernel's source, which this wrapper leaves as it is
    _stream_kernel(w_ptr, x_ptr, c_ptr, r_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr, M, N, K,
                   stride_w, stride_x, stride_c, stride_r, stride_as, stride_bs, K_SPLIT,
                   BN, BK, MP, BLOCK, SPLIT, FP8, HAS_RES, EVEN_K, False)


@triton.jit
def _rows_kernel(w_ptr, x_ptr, c_ptr, r_ptr, N, K, stride_w,
                 BN: tl.constexpr, BK: tl.constexpr, HAS_RES: tl.constexpr,
                 EVEN_K: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0):
    """c[0, n-tile] = w[n-tile] . x[0] (+ r) for one activation row, on the CUDA cores (x, c
    and r contiguous; 16-bit weights).

    No tensor-core tile and no split: each program owns BN whole weight rows and streams them
    in BK-wide tiles into a [BN, BK] fp32 accumulator, reduced once at the end, so nothing
    follows the loads but one reduction (no partials, atomics or arrival counters). Small
    programs make a grid of many, which the block scheduler balances over the SMs as they
    finish. PDL: a programmatic dependent launch (sm_90+) that lets its dependents launch at
    once, asks L2 for its first PREFETCH weight tiles, then waits for the previous kernel
    before it loads x or the residual or writes c."""
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    if PDL:
        gdc_launch_dependents()
        if PREFETCH > 0:
            LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # 128 B
            cols = tl.arange(0, PREFETCH * BK // LINE) * LINE
            prefetch_l2(w_rows + cols[None, :], n_mask[:, None] & (cols < K)[None, :])
        gdc_wait()
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k in range(0, K, BK):
        offs_k = k + tl.arange(0, BK)
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_ptr + offs_k, eviction_policy="evict_last")
        else:
            k_mask = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0, eviction_policy="evict_last")
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    c = tl.sum(acc, axis=1)
    if HAS_RES:
        c += tl.load(r_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs_n, c.to(c_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def persist_first_tile(w_ptr, N, K, stride_w, pid, rows, cols, EVEN_K: tl.constexpr,
                       PDL: tl.constexpr):
    """The persistent rows kernels' first weight tile (block pid, K tile 0); PDL: dependents
    launch first, the tile is loaded before the wait (weights are read-only in a step)."""
    offs_n = pid * rows.shape[0] + rows
    first = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w + cols[None, :]
    if EVEN_K:
        first_mask = (offs_n < N)[:, None]
    else:
        first_mask = (offs_n < N)[:, None] & (cols < K)[None, :]
    if PDL:
        gdc_launch_dependents()
        w = tl.load(first, mask=first_mask, other=0.0, eviction_policy="evict_first")
        gdc_wait()
    else:
        w = tl.load(first, mask=first_mask, other=0.0, eviction_policy="evict_first")
    return w


@triton.jit
def persist_next_tile(w_ptr, N, K, stride_w, pid, P, it, total, rows, cols, KT: tl.constexpr,
                      BK: tl.constexpr, EVEN_K: tl.constexpr):
    """Step `it` of a persistent rows program: the weight tile it will use next (block
    pid + (it // KT) P, K tile it % KT; all masked once it reaches `total`)."""
    n_nxt = (pid + (it // KT) * P) * rows.shape[0] + rows
    k_nxt = (it % KT) * BK
    live = (n_nxt < N) & (it < total)
    if EVEN_K:
        nxt_mask = live[:, None]
    else:
        nxt_mask = live[:, None] & ((k_nxt + cols) < K)[None, :]
    return tl.load(w_ptr + n_nxt.to(tl.int64)[:, None] * stride_w + k_nxt + cols[None, :],
                   mask=nxt_mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def _rows_persist_kernel(w_ptr, x_ptr, c_ptr, r_ptr, N, K, stride_w, NB, P,
                         KT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         HAS_RES: tl.constexpr,
                         EVEN_K: tl.constexpr, PDL: tl.constexpr = False):
    """The rows kernel (above) as a persistent grid: P programs, as many as fit resident, and
    program p owns the row blocks p, p + P, ... (NB blocks of BN rows, KT tiles of BK each).
    It walks its (block, K tile) sequence with the next tile's load issued before the
    current tile's FMAs (a register double buffer: two tiles in flight per program), so the
    weight stream has no gap between blocks and no second, partial wave of programs. PDL:
    dependents launch at once and the first weight tile is loaded *before* the wait (no kernel
    of a step writes weights); x, the residual and c are touched only after it."""
    pid = tl.program_id(0)
    total = ((NB - pid + P - 1) // P) * KT
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BK)
    w_cur = persist_first_tile(w_ptr, N, K, stride_w, pid, rows, cols, EVEN_K, PDL)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for it in range(1, total + 1):
        k_cur = ((it - 1) % KT) * BK
        w_nxt = persist_next_tile(w_ptr, N, K, stride_w, pid, P, it, total, rows, cols, KT,
                                  BK, EVEN_K)
        if EVEN_K:
            x = tl.load(x_ptr + k_cur + cols, eviction_policy="evict_last")
        else:
            x = tl.load(x_ptr + k_cur + cols, mask=(k_cur + cols) < K, other=0.0,
                        eviction_policy="evict_last")
        acc += w_cur.to(tl.float32) * x.to(tl.float32)[None, :]
        if it % KT == 0:  # the block's last tile: reduce, store, start the next block
            n_cur = (pid + ((it - 1) // KT) * P) * BN + rows
            c = tl.sum(acc, axis=1)
            if HAS_RES:
                c += tl.load(r_ptr + n_cur, mask=n_cur < N, other=0.0).to(tl.float32)
            tl.store(c_ptr + n_cur, c.to(c_ptr.dtype.element_ty), mask=n_cur < N)
            acc = tl.zeros((BN, BK), dtype=tl.float32)
        w_cur = w_nxt


@triton.jit
def _dot_persist_kernel(w_ptr, x_ptr, c_ptr, r_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr,
                        M, N, K, stride_w, stride_x, stride_c, stride_r, stride_as, stride_bs,
                        NB, P,
                        KS: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, MP: tl.constexpr, BLOCK: tl.constexpr,
                        FP8: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr,
                        PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0,
                        ASM_SYNC: tl.constexpr = False):
    """c[:M] = x[:M] @ w.T (+ r) for a few activation rows (M <= MP) on the tensor cores, as a
    persistent grid: the transposed tile product c.T [BN, MP] += w_tile [BN, BK] @ x_tile.T
    (the weight tile is the MMA's M side), over NB row blocks of BN rows each cut into SPLIT
    K ranges of KS tiles (units). P programs, as many as fit resident; program p takes the
    units p, p + P, ... and walks its (unit, K tile) sequence as one flat loop, so the
    software pipeline (num_stages weight tiles in flight, cp.async / TMA-style) runs on from
    one unit into the next: no pipeline refill per tile, no second, partial wave of programs.
    SPLIT > 1: a unit's partial sum is added into the fp32 workspace (ws [M, N]) and the
    unit that arrives last at its row block (arrival counter cnt[block]) takes the sum,
    re-zeroes both and writes c (as _stream_kernel). FP8: w, x e4m3 with block scales
    bs[n // BLOCK, k // BLOCK], as[m, k // BLOCK] (BK == BLOCK, BN divides BLOCK).
    PDL: dependents launch at once and the first PREFETCH weight tiles are asked into L2
    before the wait (no kernel of a step writes weights); x, r, ws and c only after it."""
    pid = tl.program_id(0)
    units = (NB * SPLIT - pid + P - 1) // P
    total = units * KS
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BK)
    offs_m = tl.arange(0, MP)
    m_mask = offs_m < M
    if PDL:
        gdc_launch_dependents()
        if PREFETCH > 0:
            LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # 128 B
            u0 = pid
            n0 = (u0 // SPLIT) * BN + rows
            pcols = (u0 % SPLIT) * KS * BK + tl.arange(0, PREFETCH * BK // LINE) * LINE
            prefetch_l2(w_ptr + n0.to(tl.int64)[:, None] * stride_w + pcols[None, :],
                        (n0 < N)[:, None] & (pcols < K)[None, :] & (u0 < NB * SPLIT))
        gdc_wait()
    acc = tl.zeros((BN, MP), dtype=tl.float32)
    for it in range(0, total):
        u = pid + (it // KS) * P
        blk = u // SPLIT
        kt = (u % SPLIT) * KS + it % KS
        offs_n = blk * BN + rows
        offs_k = kt * BK + cols
        n_mask = offs_n < N
        w_tile = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w + offs_k[None, :]
        x_tile = x_ptr + offs_m[:, None] * stride_x + offs_k[None, :]
        if EVEN_K:
            w = tl.load(w_tile, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_tile, mask=m_mask[:, None], other=0.0, eviction_policy="evict_last")
        else:
            k_mask = offs_k < K
            w = tl.load(w_tile, mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_tile, mask=m_mask[:, None] & k_mask[None, :], other=0.0,
                        eviction_policy="evict_last")
        if FP8:
            kb = kt * BK // BLOCK
            b_s = tl.load(bs_ptr + ((blk * BN) // BLOCK) * stride_bs + kb)
            a_s = tl.load(as_ptr + offs_m * stride_as + kb, mask=m_mask, other=0.0)
            acc += tl.dot(w, tl.trans(x)) * (a_s * b_s)[None, :]
        else:
            acc = tl.dot(w, tl.trans(x), acc)
        if it % KS == KS - 1:  # the unit's last tile
            mask2 = n_mask[:, None] & m_mask[None, :]
            if SPLIT > 1:
                tile = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
                tl.atomic_add(tile, acc, mask=mask2, sem="relaxed")
                # every thread's adds happen-before the counter's release: a CTA barrier
                # (as PTX on NVIDIA, which Triton's pipeliner does not treat as a barrier
                # that stops it pipelining the loop; the interpreter needs none)
                if ASM_SYNC:
                    blk = cta_sync(blk)
                else:
                    tl.debug_barrier()
                arrived = tl.atomic_add(cnt_ptr + blk, 1, sem="acq_rel")
                if arrived == SPLIT - 1:
                    bits = (ws_ptr.to(tl.pointer_type(tl.int32)) + offs_m[None, :] * N
                            + offs_n[:, None])
                    total_acc = tl.atomic_xchg(bits, tl.zeros((BN, MP), dtype=tl.int32),
                                               mask=mask2, sem="relaxed").to(tl.float32,
                                                                             bitcast=True)
                    tl.atomic_xchg(cnt_ptr + blk, 0)
                    _epilogue(total_acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c,
                              stride_r, HAS_RES)
            else:
                _epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r,
                          HAS_RES)
            acc = tl.zeros((BN, MP), dtype=tl.float32)


@triton.jit
def _epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r,
              HAS_RES: tl.constexpr):
    if HAS_RES:
        r = tl.load(r_ptr + offs_m[None, :] * stride_r + offs_n[:, None], mask=mask2, other=0.0)
        acc += r.to(tl.float32)
    tl.store(c_ptr + offs_m[None, :] * stride_c + offs_n[:, None],
             acc.to(c_ptr.dtype.element_ty), mask=mask2)


# ---- launch plan ---------------------------------------------------------------------------
# (BN, BK, num_stages, num_warps) per (operand kind, padded M): the streaming configs. They
# are a table so the autotuner can adopt them as its defaults (autotune.space keys).
STREAM_CONFIGS = {
    ("16bit", 16): dict(BN=64, BK=128, num_stages=4, num_warps=4),
    ("fp8", 16): dict(BN=64, BK=128, num_stages=4, num_warps=4),
    ("fp8", 32): dict(BN=64, BK=128, num_stages=4, num_warps=4),
    ("fp8", 64): dict(BN=64, BK=128, num_stages=3, num_warps=4),
}
# programs per SM the split aims for (enough resident tiles to keep the DRAM queues full)
TARGET_PROGRAMS_PER_SM = 4
# AMD CDNA (wave 64), 16-bit weights, per arch: heuristic, not run (no AMD GPU); the compile
# matrix shows MFMA, no scratch and LDS within the arch. The split above wants 4 programs
# resident per CU, and AMD's pipeliner holds num_stages - 1 weight + x tiles in LDS: the
# NVIDIA 4-stage 64 x 128 config takes 60 KB there, one program per CU. 4 waves: one per SIMD;
# 16 x 16 MFMA: the <= 16 tokens are padded to 16 rows (a 32-row MFMA would compute padding)
CDNA_STREAM_CONFIGS = {
    # 64 KB LDS: one 64 x 64 buffer (10 KB, 52 VGPRs) lets 4 programs share a CU
    "gfx942": dict(BN=64, BK=64, num_stages=2, num_warps=4, matrix_instr_nonkdim=16),
    # 160 KB LDS: two 64 x 128 buffers (40 KB, 84 VGPRs), 4 programs per CU
    "gfx950": dict(BN=64, BK=128, num_stages=3, num_warps=4, matrix_instr_nonkdim=16),
}
# programmatic dependent launch of the 16-bit kernel on sm_90+ CUDA (a module switch so
# benchmarks can time both). H200, graph replay (benchmarks/RESULTS.md, issue 24 decode
# section): 2-4 % faster on the 33-117 MB Llama projections (1 % slower on the 235 MB gate-up),
# 4.90 -> 4.81 ms on the B=1 Llama decode step; fp8 launches at M <= 16 were 2-21 % slower
# with it (M = 64: 0.5-3.5 % faster), so fp8 keeps plain launches.
USE_PDL = True
# the 16-bit PDL launches of `gemv` through triton_gemv_fused's early-stream kernel (first
# weight tile issued before griddepcontrol.wait, dependents triggered at program start), so
# a chain of projections streams weights continuously. Off until timed on the H200
# (benchmarks/s15_gemv_gpu.py); the fused ops' own switch is triton_gemv_fused.EARLY_FUSED.
EARLY_STREAM = False
# the 16-bit PDL launches through _stream_early_kernel: dependents triggered at program start
# and the first PREFETCH_TILES weight tiles of each program (rounded up to a power of two, at
# most its K range) asked into L2 *before* griddepcontrol.wait, so a projection's weight
# stream starts while the kernel before it (an RMSNorm, SiLU-mul, the attention merge: see
# shared/pdl.CHAIN for making those trigger early) still runs, instead of after it. 0: off
# (the launch above). 2: the fastest of 2 / 4 / 8 on the H200 (one Llama-3-8B decode layer at
# B=1 with the chain: 123.7 / 126.2 / 133.1 us vs 129.4 before; benchmarks/RESULTS.md).
PREFETCH_TILES = 2
# the same for fp8 weights (fp8_block_mm's streaming path, M <= 64): 0 keeps them plain
# launches (plain PDL, waiting before the first load, was 2-21 % slower there)
FP8_PREFETCH_TILES = 0
# 16-bit weights of one (N, K): (config, programs per SM) in place of the tuned / table config
# and TARGET_PROGRAMS_PER_SM, where the per-shape sweep on the H200 measured a faster choice
# (benchmarks/gemm_decode_ab.py, M = 1): half the K splits on Llama-3-8B's o (13.6 -> 11.2 us)
# and down (31.4 -> 30.0 us) projections
SHAPE_CONFIGS: dict[tuple[int, int], tuple[dict, int]] = {
    (4096, 4096): (STREAM_CONFIGS[("16bit", 16)], 2),
    (4096, 14336): (STREAM_CONFIGS[("16bit", 16)], 2),
}

# one activation row (M = 1) with 16-bit weights on NVIDIA: the CUDA-core rows kernel
# (_rows_kernel: no tensor-core tile, no split-K) in place of the split tensor-core kernel,
# with this launch config (BN rows per program, BK, num_warps; PREFETCH weight tiles asked
# into L2 before the PDL wait), or ROWS_SHAPE_CONFIGS's for its (N, K). None: off. H200,
# M = 1, graph replay, back-to-back calls (benchmarks/RESULTS.md, session 24): the Llama-3-8B
# projections 6144 / 4096 / 28672 x 4096 and 4096 x 14336 in 13.8 / 10.0 / 53.8 / 28.2 us
# against the split kernel's 16.6 / 10.6 / 55.8 / 29.2 and cuBLAS's 16.2 / 13.5 / 55.6 / 31.4
# (B = 1 Llama-3-8B decode 4.10 -> 3.91 ms/step). fp8 weights stay on the split kernel: the
# rows form with the block scales folded into x was 2 % faster on the 15 MB DeepSeek-V3
# shapes and 1.2-1.6x slower on the 38 / 117 MB ones.
ROWS_DEFAULT = dict(BN=4, BK=2048, num_warps=4)
ROWS_M1: dict | None = dict(ROWS_DEFAULT)
ROWS_SHAPE_CONFIGS: dict[tuple[int, int], dict] = {}
# weights up to PERSIST_MAX_BYTES take the persistent form of the rows kernel
# (_rows_persist_kernel, `rows_config`): tiles of TILE weights, BK = the largest power of two
# <= K up to BK_MAX (at least 64), BN = TILE / BK rows (at most 16); as many programs as fit
# resident. None: off (ROWS_M1 everywhere). H200, M = 1, graph replay, back-to-back calls
# (benchmarks/RESULTS.md, session 25), against the plain rows kernel: 0.5-100 MB weights
# 1.0-1.53x faster (4096 x 4096 9.89 -> 9.38 us, 5120 x 2048 7.13 -> 5.84, the 128 x 2048
# MoE router 1.88 -> 1.24), equal at 2048 x 7168; 117-1050 MB 0.4-1.7 % slower, hence the cap.
ROWS_PERSIST: dict | None = dict(TILE=8192, BK_MAX=4096, num_warps=4)
PERSIST_MAX_BYTES = 100 << 20

# 2-16 activation rows with 16-bit weights (DOT_16BIT) and fp8 block weights at 2-64 rows
# (DOT_FP8), on NVIDIA: the persistent tensor-core kernel (_dot_persist_kernel through
# dot_persist_mm: resident programs walking (row block, K range) units as one pipelined loop)
# with this config in place of the split kernel's grid of one tile per program, for weights
# within DOT_16BIT_MAX_N rows / DOT_FP8_MAX_BYTES (`dot_config`). None: off (the split
# kernel). Session 26, H100 (no H200 came), graph replay, back-to-back calls over rotated
# weights, against the split kernel in the same run (benchmarks/RESULTS.md): 16-bit, only the
# 2048-row Qwen3-30B-A3B o projection (2048 x 4096) gained (M = 16 11.21 -> 9.19 us, M = 4
# 10.38 -> 8.89); 5120 x 2048 and the Llama-3-8B projections were 1-24 % slower at every
# config. fp8 at one program per SM, 6 stages: 7168 x 2048 M = 16 11.2 -> 8.87 us, M = 64
# 21.1 -> 10.84; 2112 x 7168 M = 16 10.94 -> 10.8, M = 64 18.43 -> 13.8; the 37.7 / 117 MB
# shapes and M = 1 (2112 x 7168 9.11 -> 10.24) slower, hence the byte cap and M >= 2.
DOT_16BIT: dict | None = dict(BN=64, BK=128, num_stages=6, num_warps=4)
DOT_16BIT_MAX_N = 2048
DOT_FP8: dict | None = dict(BN=64, BK=128, num_stages=6, num_warps=4, PER_SM=1)
DOT_FP8_MAX_BYTES = 32 << 20
FP8_PERSIST_PDL = False


def dot_config(m: int, n: int, k: int, fp8: bool) -> dict | None:
    """The persistent tensor-core launch config for an M x [n, k] product, or None (the split
    kernel): 16-bit at 2-16 rows and n <= DOT_16BIT_MAX_N, fp8 at 2-64 rows and at most
    DOT_FP8_MAX_BYTES of weight."""
    if fp8:
        return DOT_FP8 if 2 <= m <= MAX_M and n * k <= DOT_FP8_MAX_BYTES else None
    return DOT_16BIT if 2 <= m <= 16 and n <= DOT_16BIT_MAX_N else None


def rows_config(n: int, k: int, itemsize: int) -> dict | None:
    """The M = 1 rows launch config of an [n, k] weight (ROWS_SHAPE_CONFIGS first); None when
    the rows kernel is off (ROWS_M1 None)."""
    if ROWS_M1 is None:
        return None
    cfg = ROWS_SHAPE_CONFIGS.get((n, k))
    if cfg is not None:
        return cfg
    if ROWS_PERSIST is None or n * k * itemsize > PERSIST_MAX_BYTES:
        return ROWS_M1
    return persist_config(k)


def persist_config(k: int) -> dict:
    """The persistent rows launch for K (ROWS_PERSIST's tile rule; its defaults when off)."""
    rule = ROWS_PERSIST or dict(TILE=8192, BK_MAX=4096, num_warps=4)
    bk = max(64, min(rule["BK_MAX"], 1 << (max(k, 1).bit_length() - 1)))
    return dict(BN=max(1, min(16, rule["TILE"] // bk)), BK=bk, num_warps=rule["num_warps"],
                PERSIST=True)

_ws: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_sms: dict[torch.device, int] = {}
_pdl_ok: dict[torch.device, bool] = {}


def _pdl(device: torch.device) -> bool:
    if not USE_PDL or device.type != "cuda" or torch.version.hip is not None:
        return False
    ok = _pdl_ok.get(device)
    if ok is None:
        ok = _pdl_ok[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return ok


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so tests still exercise the split path
    n = _sms.get(device)
    if n is None:
        n = _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace, int32 counters) of the device, zeroed once; the kernel re-zeroes what
    it used. Allocated on first use (before any graph capture that uses it, as the serving
    warm-up does)."""
    ws = _ws.get(device)
    if ws is None:
        ws = _ws[device] = (torch.zeros(WS_ELEMS, dtype=torch.float32, device=device),
                            torch.zeros(CNT_ELEMS, dtype=torch.int32, device=device))
    return ws


def mpad(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def plan(m: int, n: int, k: int, fp8: bool, device: torch.device, config: dict | None = None):
    """(config, split, k_split): the tile config and how many K splits (k_split elements each,
    a multiple of BK) give about TARGET_PROGRAMS_PER_SM programs per SM."""
    per_sm = TARGET_PROGRAMS_PER_SM
    if config is None and not fp8 and m <= 16 and (n, k) in SHAPE_CONFIGS and \
            _tune.cdna_arch(device) is None:  # H200-measured shapes
        config, per_sm = SHAPE_CONFIGS[n, k]
    cfg = dict(config or _tune.stream_config(m, n, k, fp8, None, device))
    tiles = triton.cdiv(n, cfg["BN"])
    kblocks = triton.cdiv(k, cfg["BK"])
    want = max(1, round(per_sm * _num_sms(device) / tiles))
    split = min(want, kblocks)
    if split > 1 and (m * n > WS_ELEMS or tiles > CNT_ELEMS):
        split = 1
    per = triton.cdiv(kblocks, split)
    split = triton.cdiv(kblocks, per)  # no empty splits
    return cfg, split, per * cfg["BK"]


def stream_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
              residual: torch.Tensor | None = None, x_scale: torch.Tensor | None = None,
              w_scale: torch.Tensor | None = None, block: int = 128,
              config: dict | None = None) -> torch.Tensor:
    """out[:M] = x @ w.T (+ residual) for M <= MAX_M. x [M, K], w [N, K] with unit K stride;
    out / residual [M, N] with unit N stride. fp8 when x_scale / w_scale are given."""
    m, k = x.shape
    n = w.shape[0]
    fp8 = x_scale is not None
    if m == 1 and not fp8 and config is None and ROWS_M1 is not None and \
            _tune.cdna_arch(x.device) is None:
        return rows_mm(x, w, out, residual=residual,
                       config=rows_config(n, k, w.element_size()))
    dot = dot_config(m, n, k, fp8) if config is None else None
    if dot is not None and _tune.cdna_arch(x.device) is None:
        return dot_persist_mm(x, w, out, residual=residual, x_scale=x_scale, w_scale=w_scale,
                              block=block, config=dot)
    cfg, split, k_split = plan(m, n, k, fp8, x.device, config)
    if fp8 and (cfg["BK"] != block or block % cfg["BN"]):
        raise ValueError(f"block: the fp8 streaming kernel needs block == BK ({cfg['BK']}) "
                         f"and a multiple of BN ({cfg['BN']}), got {block}")
    ws, cnt = _workspace(x.device) if split > 1 else (out, out)
    dummy = out
    r = residual if residual is not None else dummy
    a_s = x_scale if fp8 else dummy
    b_s = w_scale if fp8 else dummy
    grid = (triton.cdiv(n, cfg["BN"]), split)
    prefetch = FP8_PREFETCH_TILES if fp8 else PREFETCH_TILES
    pdl = (not fp8 or prefetch > 0) and _pdl(x.device)
    kernel, extra = _stream_kernel, {}
    # the interpreter runs the early-stream wrapper without PDL (its argument plumbing)
    if prefetch > 0 and (pdl or x.device.type == "cpu"):
        tiles = min(prefetch, triton.cdiv(k_split, cfg["BK"]))
        kernel, extra = _stream_early_kernel, {"PREFETCH": triton.next_power_of_2(tiles)}
    kernel[grid](
        w, x, out, r, ws, cnt, a_s, b_s, m, n, k, w.stride(0), x.stride(0), out.stride(0),
        r.stride(0), a_s.stride(0) if fp8 else 0, b_s.stride(0) if fp8 else 0, k_split,
        BN=cfg["BN"], BK=cfg["BK"], MP=mpad(m), BLOCK=block, SPLIT=split > 1, FP8=fp8,
        HAS_RES=residual is not None, EVEN_K=k % cfg["BK"] == 0, PDL=pdl, **extra,
        num_stages=cfg["num_stages"], num_warps=cfg["num_warps"], **backend_options(cfg),
        **({"launch_pdl": True} if pdl else {}))
    return out


def rows_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
            residual: torch.Tensor | None = None, config: dict) -> torch.Tensor:
    """out[0] = x[0] @ w.T (+ residual) through _rows_kernel, or _rows_persist_kernel when
    config["PERSIST"] (P programs: the resident count per SM, or config["PER_SM"] if fewer,
    times the SMs, evened out over the row blocks): x [1, K], w [N, K] 16-bit with unit K
    stride, out / residual [1, N] with unit N stride. BK is capped at K's next power of two
    (at least 64)."""
    n, k = w.shape
    bn = config["BN"]
    bk = min(config["BK"], max(64, triton.next_power_of_2(k)))
    pdl = _pdl(x.device)
    r = residual if residual is not None else out
    if config.get("PERSIST"):
        nb, kt = triton.cdiv(n, bn), triton.cdiv(k, bk)
        args = (w, x, out, r, n, k, w.stride(0), nb)
        meta = dict(KT=kt, BN=bn, BK=bk, HAS_RES=residual is not None, EVEN_K=k % bk == 0,
                    PDL=pdl, num_warps=config["num_warps"], num_stages=1)
        p = persist_grid(_rows_persist_kernel, x.device, args, (), nb, meta,
                         config.get("PER_SM"))
        _rows_persist_kernel[(p,)](*args, p, **meta, **({"launch_pdl": True} if pdl else {}))
        return out
    prefetch = config.get("PREFETCH", 0) if pdl else 0
    _rows_kernel[(triton.cdiv(n, bn),)](
        w, x, out, residual if residual is not None else out, n, k, w.stride(0),
        BN=bn, BK=bk, HAS_RES=residual is not None, EVEN_K=k % bk == 0, PDL=pdl,
        PREFETCH=triton.next_power_of_2(prefetch) if prefetch else 0,
        num_warps=config["num_warps"], num_stages=1, **({"launch_pdl": True} if pdl else {}))
    return out


def dot_split(nb: int, kt: int, cap: int) -> int:
    """SPLIT of a persistent tensor-core launch: the divisor s of the kt K tiles whose units
    (nb row blocks x s K ranges) give the fewest tiles to the busiest of `cap` programs,
    ceil(nb s / cap) (kt / s + 1/2 if s > 1: a split unit's atomics and arrival cost about
    half a tile), the smaller s on ties."""
    best, best_cost = 1, None
    for s in range(1, kt + 1):
        if kt % s:
            continue
        cost = -(-nb * s // cap) * (kt / s + (0.5 if s > 1 else 0.0))
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def dot_persist_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
                   residual: torch.Tensor | None = None, x_scale: torch.Tensor | None = None,
                   w_scale: torch.Tensor | None = None, block: int = 128,
                   config: dict) -> torch.Tensor:
    """out[:M] = x @ w.T (+ residual) through _dot_persist_kernel (M <= 64): x [M, K], w [N, K]
    with unit K stride, out / residual [M, N] with unit N stride; fp8 when x_scale / w_scale
    are given (BK must equal block, BN divide it). config: BN, BK, num_stages, num_warps;
    optional PER_SM (programs per SM, at most the resident count), SPLIT (else dot_split's),
    PREFETCH (weight tiles asked into L2 before the PDL wait)."""
    m, k = x.shape
    n = w.shape[0]
    fp8 = x_scale is not None
    bn, bk = config["BN"], config["BK"]
    if fp8 and (bk != block or block % bn):
        raise ValueError(f"block: the fp8 persistent kernel needs block == BK ({bk}) and a "
                         f"multiple of BN ({bn}), got {block}")
    nb, kt = triton.cdiv(n, bn), triton.cdiv(k, bk)
    pdl = _pdl(x.device) and (not fp8 or FP8_PERSIST_PDL)
    dummy = out
    r = residual if residual is not None else dummy
    a_s = x_scale if fp8 else dummy
    b_s = w_scale if fp8 else dummy
    ws, cnt = _workspace(x.device)
    args = (w, x, out, r, ws, cnt, a_s, b_s, m, n, k, w.stride(0), x.stride(0), out.stride(0),
            r.stride(0), a_s.stride(0) if fp8 else 0, b_s.stride(0) if fp8 else 0, nb)
    prefetch = config.get("PREFETCH", 0) if pdl else 0
    meta = dict(BN=bn, BK=bk, MP=mpad(m), BLOCK=block, FP8=fp8, HAS_RES=residual is not None,
                EVEN_K=k % bk == 0, PDL=pdl, ASM_SYNC=x.device.type == "cuda",
                PREFETCH=triton.next_power_of_2(prefetch) if prefetch else 0,
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    cap = _num_sms(x.device) * _resident(_dot_persist_kernel, x.device, args, (),
                                         dict(meta, KS=1, SPLIT=2), config.get("PER_SM"))
    split = config.get("SPLIT") or dot_split(nb, kt, cap)
    if kt % split or (split > 1 and (m * n > WS_ELEMS or nb > CNT_ELEMS)):
        split = 1
    units = nb * split
    p = triton.cdiv(units, triton.cdiv(units, cap))
    _dot_persist_kernel[(p,)](*args, p, KS=kt // split, SPLIT=split, **meta,
                              **({"launch_pdl": True} if pdl else {}))
    return out


_resident_cache: dict[tuple, int] = {}


def persist_grid(kernel, device: torch.device, args: tuple, tail: tuple, nb: int, meta: dict,
                 per_sm: int | None = None) -> int:
    """P of a persistent rows launch over nb row blocks: the resident count per SM (per_sm
    caps it) times the SMs, evened out so every program owns as many blocks (+-1). args /
    tail: the kernel's arguments before / after P (for its one compile, `_resident`)."""
    cap = _num_sms(device) * _resident(kernel, device, args, tail, meta, per_sm)
    return triton.cdiv(nb, triton.cdiv(nb, cap))


def _resident(kernel, device: torch.device, args: tuple, tail: tuple, meta: dict,
              per_sm: int | None) -> int:
    """Programs of `kernel` that fit on one SM at once, from its compiled register and
    shared-memory use (per_sm caps it). CPU (the interpreter): 1 (per_sm: up to 2)."""
    if device.type != "cuda":
        return 1 if per_sm is None else max(1, min(per_sm, 2))
    key = (kernel, device, tuple(sorted(meta.items())), args[0].dtype, per_sm)
    n = _resident_cache.get(key)
    if n is None:
        kern = kernel.warmup(*args, 1, *tail, **meta, grid=(1,))
        n = resident_programs(kern, device, meta["num_warps"])
        n = max(1, n if per_sm is None else min(n, per_sm))
        _resident_cache[key] = n
    return n


def compile_cases(fp8: bool) -> list[CompileCase]:
    """The streaming kernel as launched: 16-bit (M=1..16) or fp8 (M up to 64), split or not."""
    wt = "*fp8e4nv" if fp8 else "*bf16"
    sig = {"w_ptr": wt, "x_ptr": wt, "c_ptr": "*bf16", "r_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "as_ptr": "*fp32", "bs_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "stride_w": "i32", "stride_x": "i32", "stride_c": "i32",
           "stride_r": "i32", "stride_as": "i32", "stride_bs": "i32", "K_SPLIT": "i32"}
    aligned = ("N", "K", "stride_w", "stride_x", "stride_c", "stride_r", "K_SPLIT")
    cases = []
    for mp, split, res in ([(16, True, False), (64, False, False)] if fp8 else
                           [(16, False, True), (16, True, True)]):
        cfg = STREAM_CONFIGS[("fp8" if fp8 else "16bit", mp)]
        cases.append(CompileCase(
            _stream_kernel, sig, dict(BN=cfg["BN"], BK=cfg["BK"], MP=mp, BLOCK=128,
                                      SPLIT=split, FP8=fp8, HAS_RES=res, EVEN_K=True),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], uses_dot=True,
            aligned=aligned, label=f"{'fp8' if fp8 else 'bf16'} M<={mp}"
                                   f"{' split' if split else ''}{' +res' if res else ''}"))
    if not fp8:  # as launched on sm_90+ CUDA: a programmatic dependent launch (griddepcontrol)
        base = cases[-1]
        cases.append(CompileCase(_stream_kernel, sig, dict(base.constexprs, PDL=True),
                                 num_warps=base.num_warps, num_stages=base.num_stages,
                                 uses_dot=True, aligned=aligned, targets=_PDL_TARGETS,
                                 label=base.label + " pdl"))
        # PREFETCH_TILES > 0: the early-stream wrapper (L2 prefetch before the wait)
        cases.append(CompileCase(_stream_early_kernel, sig,
                                 dict(base.constexprs, PDL=True, PREFETCH=4),
                                 num_warps=base.num_warps, num_stages=base.num_stages,
                                 uses_dot=True, aligned=aligned, targets=_PDL_TARGETS,
                                 label=base.label + " pdl prefetch4"))
        # the 16-bit cases above are the NVIDIA launches; CDNA builds its own tables' configs
        cdna = [dataclasses.replace(
            c, constexprs=dict(c.constexprs, BN=cfg["BN"], BK=cfg["BK"]),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], targets=(arch,),
            options=tuple(backend_options(cfg).items()), label=f"{c.label} {arch}")
            for arch, cfg in CDNA_STREAM_CONFIGS.items() for c in cases[:2]]
        cases = [c if c.targets else dataclasses.replace(c, targets=_NVIDIA_TARGETS)
                 for c in cases] + cdna
        # the M = 1 rows kernel (NVIDIA only): plain, and the PDL launch that prefetches first
        rsig = {"w_ptr": wt, "x_ptr": wt, "c_ptr": "*bf16", "r_ptr": "*bf16", "N": "i32",
                "K": "i32", "stride_w": "i32"}
        rcfg = ROWS_M1 or ROWS_DEFAULT
        plain = CompileCase(_rows_kernel, rsig, dict(BN=rcfg["BN"], BK=rcfg["BK"],
                                                     HAS_RES=True, EVEN_K=True),
                            num_warps=rcfg["num_warps"], num_stages=1,
                            aligned=("K", "stride_w"), targets=_NVIDIA_TARGETS,
                            label="rows bf16 +res M=1")
        cases += [plain, dataclasses.replace(plain, constexprs=dict(plain.constexprs, PDL=True,
                                                                    PREFETCH=1),
                                             targets=_PDL_TARGETS,
                                             label="rows bf16 +res M=1 pdl")]
        # the persistent rows kernel as a 4096 x 4096 projection launches it
        psig = dict(rsig, NB="i32", P="i32")
        pcfg = persist_config(4096)
        persist = CompileCase(_rows_persist_kernel, psig,
                              dict(KT=4096 // pcfg["BK"], BN=pcfg["BN"], BK=pcfg["BK"],
                                   HAS_RES=True, EVEN_K=True),
                              num_warps=pcfg["num_warps"], num_stages=1,
                              aligned=("K", "stride_w"), targets=_NVIDIA_TARGETS,
                              label="rows persistent bf16 +res M=1")
        cases += [persist, dataclasses.replace(persist,
                                               constexprs=dict(persist.constexprs, PDL=True),
                                               targets=_PDL_TARGETS,
                                               label="rows persistent bf16 +res M=1 pdl")]
    # the persistent tensor-core kernel (DOT_16BIT / DOT_FP8): 16-bit at <= 16 rows split and
    # unsplit, fp8 at <= 16 and <= 64 rows, plain and as a PDL launch with one tile prefetched
    dsig = dict(sig, NB="i32", P="i32")
    dsig.pop("K_SPLIT")
    daligned = aligned[:-1]
    for mp, split in ((16, 2), (64, 1)) if fp8 else ((16, 1), (16, 4)):
        for pdl in (False, True):
            cases.append(CompileCase(
                _dot_persist_kernel, dsig,
                dict(KS=8, SPLIT=split, BN=64, BK=128, MP=mp, BLOCK=128, FP8=fp8, HAS_RES=not fp8,
                     EVEN_K=True, PDL=pdl, PREFETCH=1 if pdl else 0, ASM_SYNC=True),
                num_warps=4, num_stages=4, uses_dot=True, aligned=daligned,
                targets=_PDL_TARGETS if pdl else _NVIDIA_TARGETS,
                label=f"dot persistent {'fp8' if fp8 else 'bf16'} M<={mp}"
                      f"{' split' if split > 1 else ''}{' pdl' if pdl else ''}"))
    return cases


_PDL_TARGETS = ("sm_90", "sm_100", "sm_120")
_NVIDIA_TARGETS = ("sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


# ---- registration ----------------------------------------------------------------------------
def _gemv(a, b, *, out_dtype=None, residual=None):
    """Triton weight-streaming GEMM for M <= 16 (split-K over many CTAs, fused residual add)."""
    out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype or a.dtype, device=a.device)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return out
    if a.shape[1] == 0:
        return out.zero_() if residual is None else out.copy_(residual)
    if EARLY_STREAM and _pdl(a.device):
        from . import triton_gemv_fused
        return triton_gemv_fused.fused_stream_mm(_k_major(a), _k_major(b), out,
                                                 prologue=triton_gemv_fused.PRO_NONE,
                                                 residual=residual, early=True)
    return stream_mm(_k_major(a), _k_major(b), out, residual=residual)


def _k_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _register() -> None:
    from ...registry import register
    from .._common import TRITON

    fmts = {"a": ("fp16", "bf16"), "b": ("fp16", "bf16"), "c": ("fp16", "bf16", "fp32")}
    register("gemm", "gemv", **{**TRITON, "band": "performant"}, formats=fmts,
             traits={"residual": (False, True)},
             compile_cases=lambda: compile_cases(False))(_gemv)


_register()
