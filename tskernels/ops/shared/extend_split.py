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

import numpy as np
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
# The order work items are launched in (the hardware starts CTAs in grid order as SMs free up):
# "start" (default), by first key tile, then longest first: the CTAs running at once walk the
# same key tiles of their KV head, so L2 serves each tile to the ~16 query blocks reading it
# (H200, one Llama-3-8B layer, later turns of 800-848 new over 50.8-54.3k cached: 2-9 % faster
# than "length", benchmarks/RESULTS.md "Session 19"); "length", longest first (packs the SMs;
# the order before).
ITEM_ORDER = "start"


def block_table(counts, prefixes, block_m: int, block_n: int, group: int = 1) -> np.ndarray:
    """int64 [blocks, 4]: (request, query block, key tiles, first-row tiles) of every query block,
    request by request (see blocks_of)."""
    n = np.asarray(counts, dtype=np.int64).reshape(-1)
    pre = np.asarray(prefixes, dtype=np.int64).reshape(-1)
    rows = n * group
    per = -(-rows // block_m)
    b = np.repeat(np.arange(len(n)), per)
    i = np.arange(len(b)) - np.repeat(np.cumsum(per) - per, per)
    m0 = i * block_m
    last = np.minimum(m0 + block_m, rows[b]) - 1
    return np.stack((b, i, (pre[b] + last // group) // block_n + 1,
                     (pre[b] + m0 // group) // block_n + 1), axis=1)


def blocks_of(counts, prefixes, block_m: int, block_n: int,
              group: int = 1) -> list[tuple[int, int, int, int]]:
    """(request, query block, key tiles, first-row tiles) of every query block: the block sees
    keys 0 .. prefix + its last row's token (`key tiles` of block_n), and `first-row tiles` is
    the count of tiles up to the one holding its first row's position (every split must start
    at or below it, so that each row of each split sees a key). group > 1: GQA packing, a
    request's rows are its counts[b] * group (token, head-in-group) pairs, row r at token
    r // group."""
    return [tuple(r) for r in block_table(counts, prefixes, block_m, block_n, group).tolist()]


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


def _ranges(nt: np.ndarray, fr: np.ndarray, splits: np.ndarray):
    """tile_ranges of many blocks at once: nt, fr [..., blocks], splits broadcastable to them.
    Returns (t0, t1, valid) [..., blocks, max splits]; part k of a block is valid for
    k < min(splits, fr)."""
    if nt.size and (fr.min() < 1 or (fr > nt).any()):
        raise ValueError("tile_ranges: need 1 <= first_row_tiles <= n_tiles (a negative "
                         "prefix?)")
    s = np.minimum(splits, fr)[..., None]
    k = np.arange(int(np.max(splits, initial=1)))
    t0 = np.minimum(k * nt[..., None] // s, fr[..., None] - s + k)
    t1 = np.empty_like(t0)
    t1[..., :-1] = t0[..., 1:]
    t1 = np.where(k + 1 < s, t1, nt[..., None])
    return t0, t1, k < s


def split_table(counts, prefixes, splits: int, block_m: int = 128, block_n: int = 128,
                group: int = 1) -> np.ndarray:
    """split_work as an int32 [items, 5] array."""
    if splits < 1:
        raise ValueError(f"tile_ranges: splits >= 1 ({splits})")
    blocks = block_table(counts, prefixes, block_m, block_n, group)
    t0, t1, valid = _ranges(blocks[:, 2], blocks[:, 3], splits)
    b, k = np.nonzero(valid)
    work = np.stack((blocks[b, 0], blocks[b, 1], t0[b, k], t1[b, k], k), axis=1)
    work = work[_order(work)]
    return work.astype(np.int32)


def _order(work: np.ndarray) -> np.ndarray:
    """The launch order of (request, query block, t0, t1, k) rows (ITEM_ORDER)."""
    if ITEM_ORDER == "start":
        return np.lexsort((work[:, 1], work[:, 0], work[:, 2] - work[:, 3], work[:, 2]))
    return np.argsort(work[:, 2] - work[:, 3], kind="stable")


def split_work(counts, prefixes, splits: int, block_m: int = 128, block_n: int = 128,
               group: int = 1) -> list[tuple[int, int, int, int, int]]:
    """(request, query block, t0, t1, split index) work items in ITEM_ORDER (the hardware
    starts CTAs in grid order); group: see blocks_of."""
    return [tuple(w) for w in split_table(counts, prefixes, splits, block_m, block_n,
                                          group).tolist()]


def workspace_bytes(num_tokens: int, hq: int, splits: int, head_dim: int = 128) -> int:
    """fp32 partial rows plus their fp32 LSE."""
    return num_tokens * hq * splits * (head_dim + 1) * 4


def _wave_tiles(blocks: np.ndarray, heads: int, splits, num_sms: int) -> list[float]:
    """Per split count: the sum, over waves, of each wave's first (longest) item in tiles (item
    overhead included); an item's `heads` CTAs start in longest-first order, one per SM (the
    model of ITEM_ORDER "length"; "start" launches a block's equal parts in the same waves
    and differs from it in L2 reuse, which the model does not see)."""
    splits = np.asarray(splits, dtype=np.int64).reshape(-1, 1)
    nt, fr = blocks[:, 2], blocks[:, 3]
    t0, t1, valid = _ranges(np.broadcast_to(nt, (len(splits), len(nt))),
                            np.broadcast_to(fr, (len(splits), len(fr))), splits)
    lengths = np.where(valid, t1 - t0, -1).reshape(len(splits), -1)
    lengths = -np.sort(-lengths, axis=1)               # longest first, unused parts last
    items = valid.reshape(len(splits), -1).sum(axis=1) * heads
    firsts = np.arange(0, int(items.max(initial=0)), max(num_sms, 1))  # each wave's first CTA
    firsts = firsts[firsts < items.max(initial=0)]
    lead = lengths[:, firsts // heads] if len(firsts) else np.zeros((len(splits), 0), np.int64)
    waves = firsts[None, :] < items[:, None]
    # every length is a whole number of tiles + ITEM_OVERHEAD_TILES: exact in float64, so the
    # sum equals the item-by-item sum in any order
    return [float(w) + ITEM_OVERHEAD_TILES * int(c)
            for w, c in zip(np.where(waves, lead, 0).sum(axis=1).tolist(),
                            waves.sum(axis=1).tolist())]


def estimated_us(blocks, heads: int, splits: int, num_sms: int, num_tokens: int,
                 hq: int | None = None) -> float:
    """A model of the launch time (us): `heads` CTAs per block and split (query heads, or KV
    heads when GQA-packed) start in longest-first order one per SM, each wave lasting as long
    as its first (longest) item, plus the merge's stream of the partials (num_tokens x hq rows,
    hq default heads) when split. blocks: blocks_of's tuples or block_table's array."""
    blocks = np.asarray(blocks, dtype=np.int64).reshape(-1, 4)
    return _us(_wave_tiles(blocks, heads, [splits], num_sms)[0], splits, num_tokens,
               hq or heads)


def _us(wave_tiles: float, splits: int, num_tokens: int, hq: int) -> float:
    us = wave_tiles * TILE_US
    if splits > 1:
        rows = workspace_bytes(num_tokens, hq, splits)
        us += MERGE_LAUNCH_US + rows * 1.25 / MERGE_BW * 1e6
    return us


def choose_splits(counts, prefixes, hq: int, num_sms: int, block_m: int = 128,
                  block_n: int = 128, group: int = 1) -> int:
    """The plan's split count when none is forced: 1 for grids of AUTO_MAX_WAVES waves or more
    (a 4k prefill is 1024 CTAs: splitting would only add the merge), else the candidate with
    the least modelled time when it beats one split by 1 - AUTO_GAIN, within the workspace cap
    and the merge grid's token limit. group > 1: GQA-packed blocks (hq // group CTAs each).
    Every candidate is modelled in one numpy pass (the later turn's 25 blocks x 11 candidates
    took ~1.4 ms as a Python loop on the development machine)."""
    blocks = block_table(counts, prefixes, block_m, block_n, group)
    T, heads = int(np.sum(counts)), hq // group
    if not len(blocks) or heads * len(blocks) >= AUTO_MAX_WAVES * num_sms or \
            T > MAX_MERGE_TOKENS:
        return 1
    most = int(blocks[:, 3].max())
    cands = [1]
    for s in CANDIDATES[1:]:
        if s > most or workspace_bytes(T, hq, s) > WORKSPACE_CAP:
            break
        cands.append(s)
    tiles = _wave_tiles(blocks, heads, cands, num_sms)
    base = _us(tiles[0], 1, T, hq)
    best, best_us = 1, base
    for s, w in zip(cands[1:], tiles[1:]):
        us = _us(w, s, T, hq)
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
    if splits > 1 and int(np.sum(counts)) > MAX_MERGE_TOKENS:
        raise ValueError(f"CUDA paged extend: splits > 1 takes at most {MAX_MERGE_TOKENS} new "
                         f"tokens per plan, got {int(np.sum(counts))}")
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
