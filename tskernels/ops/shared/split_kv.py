"""Split-KV: how many splits a decode batch gets, and the Triton kernel that merges the splits'
partial (o, lse) rows into the output (attention decode and MLA decode, Triton and CUDA).

Partials are fp32 rows [(b * H + h) * num_splits + s, ROW] with their natural-log sum of
exponentials lse; the merge is o = sum_s exp(lse_s - M) o_s / (sum_s exp(lse_s - M) + exp(sink
- M)), so a split that saw no key (lse = -inf) contributes nothing.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

MAX_SPLITS = 64


@triton.jit
def merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, rows, sm, d, o_sb, o_sh,
                D: tl.constexpr, ROW: tl.constexpr, SINKS: tl.constexpr,
                BYPASS_L1: tl.constexpr):
    """o[b, h, d] = sum_s exp(lse_s - M) o_s / (sum_s exp(lse_s - M) + exp(sink - M)) over the
    partial rows `rows` (mask sm; ROW elements apart) and the columns d (< D). BYPASS_L1: read
    them with .cg (written by other CTAs of the running kernel)."""
    if BYPASS_L1:
        lse = tl.load(plse_ptr + rows, mask=sm, other=float("-inf"), cache_modifier=".cg")
        po = tl.load(po_ptr + rows[:, None] * ROW + d[None, :], mask=sm[:, None],
                     other=0.0, cache_modifier=".cg")
    else:
        lse = tl.load(plse_ptr + rows, mask=sm, other=float("-inf"))
        po = tl.load(po_ptr + rows[:, None] * ROW + d[None, :], mask=sm[:, None],
                     other=0.0)
    m = tl.max(lse, 0)
    if SINKS:
        sink = tl.load(sink_ptr + h)
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)
    den = tl.sum(w, 0)
    if SINKS:
        den += tl.exp(sink - m)
    o = tl.sum(po * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * o_sb + h * o_sh + d, o.to(o_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def merge_group(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h0, num_splits, row_stride,
                 o_sb, o_sh, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_S: tl.constexpr, SINKS: tl.constexpr):
    """Merge the num_splits partials of query heads h0 .. h0 + G - 1 into o, one head at a
    time, each from one [splits x D] load (rows (b * H + h) * num_splits + s)."""
    sidx = tl.arange(0, BLOCK_S)
    sm = sidx < num_splits
    d = tl.arange(0, BLOCK_D)
    for g in range(G):
        h = h0 + g
        rows = (b * row_stride + h) * num_splits + sidx
        merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, rows, sm, d, o_sb, o_sh, D,
                    BLOCK_D, SINKS, True)


@triton.jit
def merge_kernel(po_ptr, plse_ptr, sink_ptr, o_ptr, num_splits, H, o_sb, o_sh,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                  SINKS: tl.constexpr, PDL: tl.constexpr = False, ROW: tl.constexpr = 0,
                  TRIGGER: tl.constexpr = False):
    """One (head, request, BLOCK_D columns) per program (grid (H, B) when BLOCK_D covers a
    row, (H, B, D / BLOCK_D) for wide rows: MLA's 512 columns at 64 splits would be 32 K
    fp32 values in one program's registers): merge its split-KV partials (see merge_head).
    ROW: the partial rows' length (0: BLOCK_D). PDL: launched as a programmatic dependent of
    the decode kernel (its launch overlaps the decode); wait for the decode grid's completion
    and memory before reading its partials. TRIGGER (with PDL; shared/pdl.CHAIN "merge"):
    its own dependent (the o projection's gemv) may launch at once."""
    if TRIGGER:
        gdc_launch_dependents()
    if PDL:
        gdc_wait()
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    sidx = tl.arange(0, BLOCK_S)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    sm = sidx < num_splits
    row = (b * H + h) * num_splits + sidx
    if ROW == 0:
        merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, row, sm, d, o_sb, o_sh, D,
                    BLOCK_D, SINKS, False)
    else:
        merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, row, sm, d, o_sb, o_sh, D,
                    ROW, SINKS, False)


MERGE_TILE = 4096  # fp32 values one merge program holds comfortably


def merge_block_d(d: int, block_s: int) -> int:
    """Columns per merge program for rows of d (a power of two) fp32 values and BLOCK_S
    splits: ~MERGE_TILE values per program, whole rows when they fit (few splits: fewer, larger
    programs; H200, MLA B=16 128 heads 4 splits: 16 K programs of [4 x 64] took 63.0 us vs
    51.2 with 2 K of [4 x 512]), at least 64 columns."""
    return max(min(d, 64), min(d, MERGE_TILE // block_s))


def merge_warps(block_s: int, block_d: int) -> int:
    """Warps of a whole-row merge program: one while its [BLOCK_S x BLOCK_D] fp32 tile fits
    (150 registers at 32 x 128), four beyond (one warp at 64 x 128: 255 registers and a stack;
    triton 3.6 AOT for sm_90)."""
    return 1 if block_s * block_d <= MERGE_TILE else 4


def choose_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                  block_n: int, min_chunk: int = 128, long_chunk: int | None = None) -> int:
    """Enough (request, KV head, split) programs for ~2 per SM, each with >= min_chunk keys
    (H200 sweep: B=1 L=4k best at 32 splits, B=16 L=4k at 3-6, B>=64 at 1).

    long_chunk: up to ~4 programs per SM while every split keeps >= long_chunk keys. Two per
    SM leave a long context's KV stream short of the copy rate (H200, bf16 cache, B=1, 8 KV
    heads, graph replay: 51.7k keys 67.6 us at 33 splits, 57.1 at 64; 16k keys 22.9 at 32,
    27.6 at 64; benchmarks/RESULTS.md, "Session 15")."""
    base = max(1, batch * num_kv_heads)
    want = triton.cdiv(2 * max(num_sms, 1), base)
    cap = max(1, triton.cdiv(max(max_seq_len, 1), max(min_chunk, block_n)))
    splits = max(1, min(want, cap, MAX_SPLITS))
    if long_chunk:
        while (splits < MAX_SPLITS and base * min(2 * splits, MAX_SPLITS) <= 4 * num_sms
               and max_seq_len >= 2 * splits * long_chunk):
            splits = min(2 * splits, MAX_SPLITS)
    return int(splits)
