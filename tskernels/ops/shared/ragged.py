"""Ragged batches cut into fixed-size blocks without a host sync.

A kernel over the blocks of N sequences (lengths from cumulative offsets cu_seqlens) launches an
upper bound of programs, T // block + N, and each program finds its (sequence, block) by a
binary search in `block_offsets(cu_seqlens, block)` (cumulative blocks per sequence, computed on
the device); programs past the last block exit. The grid, and so a captured CUDA graph, then
depends only on T and N, never on the lengths.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def block_offsets(cu_seqlens: torch.Tensor, block: int) -> torch.Tensor:
    """int32 [N + 1]: entry n is the number of `block`-token blocks of sequences 0..n-1."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    blocks = torch.div(lens + (block - 1), block, rounding_mode="floor")
    return torch.cat([torch.zeros(1, dtype=torch.int32, device=cu_seqlens.device),
                      blocks.cumsum(0).to(torch.int32)])


def search_steps(num_seqs: int) -> int:
    """Binary-search iterations for N sequences (at least 4: one specialisation up to N = 8)."""
    return max(4, (num_seqs - 1).bit_length() + 1)


@triton.jit
def locate_block(offsets_ptr, c, N, STEPS: tl.constexpr):
    """The sequence n with offsets[n] <= c < offsets[n + 1] (c below offsets[N])."""
    lo = c * 0
    hi = lo + N
    for _ in range(STEPS):
        mid = (lo + hi) // 2
        go = tl.load(offsets_ptr + mid) <= c
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def block_bounds(offsets_ptr, cu_ptr, c, N, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Block c's sequence n, that sequence's first row bos and length (int64), and the block's
    first row inside the sequence, t0 (c below offsets[N])."""
    n = locate_block(offsets_ptr, c, N, STEPS)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    t0 = (c - tl.load(offsets_ptr + n)).to(tl.int64) * BLOCK
    return n, bos, length, t0
