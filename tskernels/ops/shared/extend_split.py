"""Split-KV for the CUDA paged extend (ops/attention/cuda_extend.py: `cuda/prefill_wgmma.cu`
built with -DPAGED -DSPLIT): the host-side plan (how many key splits, which tiles each work item
walks) and the merge launch.

Why: one CTA per (128-query block, query head) walks every key of its request. A later turn of
an agent session (800 new tokens over a 51k prefix, 32 heads) is 7 x 32 = 224 CTAs of ~400 key
tiles each on 132 SMs (1.7 waves: the second wave runs half empty); a short follow-up (16 new
tokens) is 32 CTAs, 100 SMs idle. Splitting each block's keys into `splits` contiguous tile
ranges gives hq * blocks * splits shorter work items that fill the SMs; each writes normalised
fp32 partial rows and their log-sum-exp, merged by split_kv.py's merge kernel (the
decode paths' layout: rows [(token * hq + h) * splits + s, 128]).

Everything here is host arithmetic on the plan's lengths (no device sync, no allocation per
run): the workspace is allocated once per plan, its unused rows (blocks with fewer splits than
the plan's count) hold o = 0, lse = -inf, which the merge weighs by exp(-inf) = 0.
"""
from __future__ import annotations

import torch

from .split_kv import merge_kernel, merge_warps

MAX_SPLITS = 64            # the merge kernel's limit (ops/shared/split_kv.py)
AUTO_MAX_WAVES = 4         # grids of this many waves of 1-CTA-per-SM items are not split
ITEM_OVERHEAD_TILES = 1.5  # per work item: Q tile load, ring fill, epilogue (in key tiles)
TILE_US = 2.8              # one 128 x 128 key tile per CTA (395 TFLOP/s over 132 SMs, H200)
MERGE_BW = 3.0e12          # bytes/s the merge streams (H200 HBM, a round figure)
MERGE_LAUNCH_US = 4.0
WORKSPACE_CAP = 256 << 20  # bytes of partials an automatic choice may allocate
MAX_MERGE_TOKENS = 65535   # the merge grid's second dimension
AUTO_GAIN = 0.92           # split only when the model predicts at least 8 % less time
CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


def blocks_of(counts, prefixes, block_m: int, block_n: int,
              group: int = 1) -> list[tuple[int, int, int, int]]:
    """(request, query block, key tiles, first-row tiles) of every query block: the block sees
    keys 0 .. prefix + its last row's token (`key tiles` of block_n), and `first-row tiles` is
    the count of tiles up to the one holding its first row's position (every split must start
    at or below it, so that each row of each split sees a key). group > 1: GQA packing, a
    request's rows are its counts[b] * group (token, head-in-group) pairs, row r at token
    r // group."""
    out = []
    for b, (n, pre) in enumerate(zip(counts, prefixes)):
        rows = n * group
        for i in range(-(-rows // block_m)):
            m0 = i * block_m
            last = min(m0 + block_m, rows) - 1
            out.append((b, i, (pre + last // group) // block_n + 1,
                        (pre + m0 // group) // block_n + 1))
    return out


def tile_ranges(n_tiles: int, first_row_tiles: int, splits: int) -> list[tuple[int, int]]:
    """[t0, t1) key-tile ranges of one block cut into min(splits, first_row_tiles) parts of
    near-equal length, contiguous and covering 0 .. n_tiles; the last part holds every tile the
    causal mask touches and every part starts at or below the first row's tile."""
    if n_tiles < 1 or not 1 <= first_row_tiles <= n_tiles or splits < 1:
        raise ValueError(f"tile_ranges: need 1 <= first_row_tiles ({first_row_tiles}) <= "
                         f"n_tiles ({n_tiles}) and splits >= 1 ({splits})")
    s = min(splits, first_row_tiles)
    starts = [min(k * n_tiles // s, first_row_tiles - s + k) for k in range(s)]
    return list(zip(starts, starts[1:] + [n_tiles]))


def split_work(counts, prefixes, splits: int, block_m: int = 128, block_n: int = 128,
               group: int = 1) -> list[tuple[int, int, int, int, int]]:
    """(request, query block, t0, t1, split index) work items, the longest first (the hardware
    starts CTAs in grid order: longest-first packs the SMs best); group: see blocks_of."""
    work = [(b, i, t0, t1, k)
            for b, i, nt, fr in blocks_of(counts, prefixes, block_m, block_n, group)
            for k, (t0, t1) in enumerate(tile_ranges(nt, fr, splits))]
    work.sort(key=lambda w: -(w[3] - w[2]))
    return work


def workspace_bytes(num_tokens: int, hq: int, splits: int, head_dim: int = 128) -> int:
    """fp32 partial rows plus their fp32 LSE."""
    return num_tokens * hq * splits * (head_dim + 1) * 4


def estimated_us(blocks, heads: int, splits: int, num_sms: int, num_tokens: int,
                 hq: int | None = None) -> float:
    """A model of the launch time (us): `heads` CTAs per block and split (query heads, or KV
    heads when GQA-packed) start in longest-first order one per SM, each wave lasting as long
    as its first (longest) item, plus the merge's stream of the partials (num_tokens x hq rows,
    hq default heads) when split."""
    lengths: dict[float, int] = {}
    for _, _, nt, fr in blocks:
        for t0, t1 in tile_ranges(nt, fr, splits):
            key = t1 - t0 + ITEM_OVERHEAD_TILES
            lengths[key] = lengths.get(key, 0) + heads
    total, pos, nxt = 0.0, 0, 0  # items placed; the next wave starts at item `nxt`
    for length in sorted(lengths, reverse=True):
        cnt = lengths[length]
        while nxt < pos + cnt:  # a wave starts within this run of equal items
            total += length
            nxt += num_sms
        pos += cnt
    us = total * TILE_US
    if splits > 1:
        rows = workspace_bytes(num_tokens, hq or heads, splits)
        us += MERGE_LAUNCH_US + rows * 1.25 / MERGE_BW * 1e6
    return us


def choose_splits(counts, prefixes, hq: int, num_sms: int, block_m: int = 128,
                  block_n: int = 128, group: int = 1) -> int:
    """The plan's split count when none is forced: 1 for grids of AUTO_MAX_WAVES waves or more
    (a 4k prefill is 1024 CTAs: splitting would only add the merge), else the candidate with
    the least modelled time when it beats one split by 1 - AUTO_GAIN, within the workspace cap
    and the merge grid's token limit. group > 1: GQA-packed blocks (hq // group CTAs each)."""
    blocks = blocks_of(counts, prefixes, block_m, block_n, group)
    T, heads = sum(counts), hq // group
    if not blocks or heads * len(blocks) >= AUTO_MAX_WAVES * num_sms or T > MAX_MERGE_TOKENS:
        return 1
    most = max(fr for *_, fr in blocks)
    base = estimated_us(blocks, heads, 1, num_sms, T, hq)
    best, best_us = 1, base
    for s in CANDIDATES[1:]:
        if s > most or workspace_bytes(T, hq, s) > WORKSPACE_CAP:
            break
        us = estimated_us(blocks, heads, s, num_sms, T, hq)
        if us < best_us:
            best, best_us = s, us
    return best if best_us < AUTO_GAIN * base else 1


def resolve_splits(splits, counts, prefixes, hq: int, num_sms: int, block_m: int = 128,
                   block_n: int = 128, group: int = 1) -> int:
    """splits: None (choose), or a count 1 .. MAX_SPLITS (1: the unsplit launch)."""
    if splits is None:
        return choose_splits(counts, prefixes, hq, num_sms, block_m, block_n, group)
    if isinstance(splits, bool) or not isinstance(splits, int) or \
            not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"CUDA paged extend: splits must be None (choose) or an int in "
                         f"1..{MAX_SPLITS}, got {splits!r}")
    if splits > 1 and sum(counts) > MAX_MERGE_TOKENS:
        raise ValueError(f"CUDA paged extend: splits > 1 takes at most {MAX_MERGE_TOKENS} new "
                         f"tokens per plan, got {sum(counts)}")
    return splits


def workspace(num_tokens: int, hq: int, splits: int, device) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
    """Partial O rows [T * hq * splits, 128] fp32 = 0 and LSE [T * hq * splits] = -inf (rows
    the kernel never writes keep these: the merge gives them weight 0)."""
    n = max(num_tokens * hq * splits, 1)
    return (torch.zeros(n, 128, dtype=torch.float32, device=device),
            torch.full((n,), float("-inf"), dtype=torch.float32, device=device))


def merge(partial_o: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor,
          splits: int) -> None:
    """out [T, hq, 128] (16-bit, any row / head stride) = the merge of each row's splits."""
    T, hq = out.shape[0], out.shape[1]
    if T == 0:
        return
    bs = max(2, 1 << (splits - 1).bit_length())
    merge_kernel[(hq, T)](partial_o, partial_lse, partial_lse, out, splits, hq, out.stride(0),
                          out.stride(1), D=128, BLOCK_D=128, BLOCK_S=bs, SINKS=False,
                          num_warps=merge_warps(bs, 128))
