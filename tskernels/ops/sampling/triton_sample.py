"""Triton top-k / top-p / min-p sampling with per-request parameters and seeds, no full sort.

This module holds the shared pieces (Philox noise, the candidate finish, the exact bisection
fallback and split-V race), the registered entry point, and the first pipeline, which finds
the candidates with a histogram (below); the default pipeline is triton_groupmax.py's.

The kept set is {s >= tau}, s = logits / temperature, tau the largest of the three threshold
rules (see tskernels_ref.sampling), and the draw is the Gumbel race argmax_{kept} s + g with
g from Philox keyed by the request's seed, counter (token id, step): it depends on nothing but
the request's own row, so seeded draws are the same in any batch and under graph replay.
Finding tau without sorting V values (chunks of CHUNK logits, S chunks per row):
  1-2. _stats_hist (B x S), the one full read: per-chunk max and sum of exp of s (and of the
     raw logits, for logprobs), and a histogram over NB bins of width 1/BINS_PER_UNIT on an
     absolute grid (floor(s * BINS_PER_UNIT)) below the chunk's max, last bin everything lower.
  3. _plan (B): the chunk histograms shifted onto the row's bins; the deepest bin that must
     hold every kept token: top-k's bin (top-p renormalises over the top-k set, so all of it is kept as candidates),
     else the shallower of top-p's (a lower bound on each bin's mass, exp of its lower edge,
     says where top_p of the mass is surely reached) and min-p's; plus each chunk's offset.
  4. _compact (B x S): rows with at most CMAX candidates write them (s, id) to a buffer.
  5. _finish (B): those rows sort their candidates (CMAX values, in registers), apply the
     three rules exactly, race, and write the token. Rows with more candidates (near-flat
     distributions, min-p alone, ...) find tau exactly by bisection over the whole row (one
     program per row: slow, but exact and rare) and leave the race to
  6. _race_chunk / _race_final (B x S, B): the split-V race over {s >= tau}.
Every sum runs in a fixed order, so equal rows give bit-equal thresholds and tokens.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON

FORMATS = {"logits": ("fp32", "fp16", "bf16")}
CHUNK = 4096
NB = 256
BINS_PER_UNIT = 8.0
CMAX = 2048
C_SMALL = 256  # rows with few candidates (top-k 50) sort only this many
EPS = 1e-5  # tskernels_ref.sampling.SAMPLING_EPS
I32_MAX = 2147483647


@triton.jit
def _scaled(x_ptr, row, cols, valid, stride, inv_t):
    x = tl.load(x_ptr + row.to(tl.int64) * stride + cols, mask=valid,
                other=float("-inf")).to(tl.float32)
    return x, tl.where(valid, x * inv_t, float("-inf"))


@triton.jit
def _inv_temperature(t_ptr, row):
    t = tl.load(t_ptr + row)
    return tl.where(t < 1e-5, 1.0, 1.0 / tl.maximum(t, 1e-5))


@triton.jit
def _top_k(k_ptr, row, V):
    """A row's top-k (int32 or int64 [B]) clamped to [-1, V], as int32 (no torch op)."""
    return tl.minimum(tl.maximum(tl.load(k_ptr + row), -1), V).to(tl.int32)


@triton.jit
def _sortable(s):
    """float32 -> int32 with the same order (NaN-free input)."""
    b = s.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _gumbel(seed, step, idx):
    """Gumbel noise of token ids idx for one request: Philox(key seed, counter (id, step))."""
    lo = (step & 0xFFFFFFFF).to(tl.uint32)
    hi = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
    zero = (idx * 0).to(tl.uint32)
    r0, _, _, _ = tl.philox(seed, idx.to(tl.uint32), zero + lo, zero + hi, zero)
    u = (r0 >> 8).to(tl.float32) * 5.9604644775390625e-08 + 2.9802322387695312e-08
    return -tl.log(-tl.log(u))


@triton.jit
def _grid(s, BINS_PER_UNIT: tl.constexpr):
    """floor(s * BINS_PER_UNIT): the bin grid is absolute, so chunks histogrammed below their
    own max line up with the row's bins by an integer shift."""
    return tl.floor(tl.minimum(tl.maximum(s * BINS_PER_UNIT, -1e9), 1e9)).to(tl.int32)


@triton.jit
def _stats_hist(x_ptr, t_ptr, part_ptr, cnt_ptr, V, stride, S, CHUNK: tl.constexpr,
                NB: tl.constexpr, BINS_PER_UNIT: tl.constexpr):
    """One read of a chunk: max and sum of exp of s and of the raw logits, and the chunk's
    histogram over NB bins below its own max (last bin: everything lower)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    valid = cols < V
    x, s = _scaled(x_ptr, row, cols, valid, stride, _inv_temperature(t_ptr, row))
    m = tl.max(s, axis=0)
    z = tl.sum(tl.where(valid & (s > float("-inf")), tl.exp(s - m), 0.0), axis=0)
    rm = tl.max(x, axis=0)
    rz = tl.sum(tl.where(valid & (x > float("-inf")), tl.exp(x - rm), 0.0), axis=0)
    p = part_ptr + (row * S + c) * 4
    tl.store(p, m)
    tl.store(p + 1, z)
    tl.store(p + 2, rm)
    tl.store(p + 3, rz)
    local = tl.minimum(_grid(m, BINS_PER_UNIT) - _grid(s, BINS_PER_UNIT), NB - 1)
    tl.store(cnt_ptr + (row * S + c) * NB + tl.arange(0, NB), tl.histogram(local, NB, mask=valid))


@triton.jit
def _plan(part_ptr, cnt_ptr, t_ptr, k_ptr, p_ptr, minp_ptr, plan_ptr, stat_ptr, off_ptr,
          V, S, CHUNK: tl.constexpr, NB: tl.constexpr, BINS_PER_UNIT: tl.constexpr,
          BLOCK_S: tl.constexpr, CMAX: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_S)
    cok = c < S
    pp = part_ptr + (row * S + c) * 4
    m = tl.load(pp, mask=cok, other=float("-inf"))
    M = tl.max(m, axis=0)
    Z = tl.sum(tl.where(cok & (m > float("-inf")), tl.load(pp + 1, mask=cok, other=0.0)
                        * tl.exp(m - M), 0.0), axis=0)
    rm = tl.load(pp + 2, mask=cok, other=float("-inf"))
    RM = tl.max(rm, axis=0)
    RZ = tl.sum(tl.where(cok & (rm > float("-inf")), tl.load(pp + 3, mask=cok, other=0.0)
                         * tl.exp(rm - RM), 0.0), axis=0)
    # the chunks' histograms moved onto the row's bins (global bin = local + shift)
    b = tl.arange(0, NB)
    shift = _grid(M, BINS_PER_UNIT) - _grid(m, BINS_PER_UNIT)
    src = b[None, :] - shift[:, None]
    ok = cok[:, None] & (src >= 0) & (src < NB - 1)
    cnt = tl.load(cnt_ptr + (row * S + c[:, None]) * NB + src, mask=ok, other=0)
    tot = tl.sum(cnt, axis=0)
    cum = tl.where(b == NB - 1, V, tl.cumsum(tot, axis=0))
    k = _top_k(k_ptr, row, V)
    top_p = tl.load(p_ptr + row)
    min_p = tl.load(minp_ptr + row)
    greedy = tl.load(t_ptr + row) < 1e-5
    k_on = (k > 0) & (k < V)
    j_k = tl.sum((cum < k).to(tl.int32), axis=0)
    # a lower bound on each bin's mass (relative to exp(M)); the last bin has none
    lb_one = tl.where(b < NB - 1, tl.exp(-(b + 1).to(tl.float32) / BINS_PER_UNIT), 0.0)
    lb = tl.cumsum(tot.to(tl.float32) * lb_one, axis=0)
    j_p = tl.minimum(tl.sum((lb < top_p * Z * 1.001).to(tl.int32), axis=0), NB - 1)
    j_p = tl.where(top_p < 1.0, j_p, NB - 1)
    j_m = tl.minimum(-tl.log(tl.maximum(min_p, 1e-30)) * BINS_PER_UNIT + 2.0, NB - 1.0)
    j_m = tl.where(min_p > 0, j_m.to(tl.int32), NB - 1)
    j = tl.where(k_on, tl.where(top_p < 1.0, j_k, tl.minimum(j_k, j_m)), tl.minimum(j_p, j_m))
    j = tl.where(greedy, 0, j)
    n = tl.sum(tl.where(b == j, cum, 0), axis=0)
    chunk_len = tl.minimum(V - c * CHUNK, CHUNK)
    per_chunk = tl.where(j == NB - 1, chunk_len, tl.sum(tl.where(b[None, :] <= j, cnt, 0), axis=1))
    per_chunk = tl.where(cok, per_chunk, 0)
    tl.store(off_ptr + row * S + c, tl.cumsum(per_chunk, axis=0) - per_chunk, mask=cok)
    tl.store(plan_ptr + row * 2, j)
    tl.store(plan_ptr + row * 2 + 1, n)
    tl.store(stat_ptr + row * 4, M)
    tl.store(stat_ptr + row * 4 + 1, Z)
    tl.store(stat_ptr + row * 4 + 2, RM + tl.log(RZ))


@triton.jit
def _compact(x_ptr, t_ptr, stat_ptr, plan_ptr, off_ptr, cs_ptr, ci_ptr, V, stride, S,
             CHUNK: tl.constexpr, NB: tl.constexpr, BINS_PER_UNIT: tl.constexpr,
             CMAX: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if tl.load(plan_ptr + row * 2 + 1) <= CMAX:
        j = tl.load(plan_ptr + row * 2)
        M = tl.load(stat_ptr + row * 4)
        cols = c * CHUNK + tl.arange(0, CHUNK)
        valid = cols < V
        _, s = _scaled(x_ptr, row, cols, valid, stride, _inv_temperature(t_ptr, row))
        gbin = tl.minimum(_grid(M, BINS_PER_UNIT) - _grid(s, BINS_PER_UNIT), NB - 1)
        sel = valid & (gbin <= j)
        pos = tl.load(off_ptr + row * S + c) + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(cs_ptr + row * CMAX + pos, s, mask=sel)
        tl.store(ci_ptr + row * CMAX + pos, cols, mask=sel)


@triton.jit
def _unsortable(k):
    return tl.where(k < 0, k ^ 0x7FFFFFFF, k).to(tl.float32, bitcast=True)


@triton.jit
def _count_ge(x_ptr, row, stride, V, inv_t, key_lo, BLOCK: tl.constexpr):
    n = 0
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        valid = cols < V
        _, s = _scaled(x_ptr, row, cols, valid, stride, inv_t)
        n += tl.sum((valid & (_sortable(s) >= key_lo)).to(tl.int32), axis=0)
    return n


@triton.jit
def _mass_ge(x_ptr, row, stride, V, inv_t, M, key_lo, BLOCK: tl.constexpr):
    z = 0.0
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        valid = cols < V
        _, s = _scaled(x_ptr, row, cols, valid, stride, inv_t)
        z += tl.sum(tl.where(valid & (_sortable(s) >= key_lo), tl.exp(s - M), 0.0), axis=0)
    return z


@triton.jit
def _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr, tok_ptr, lp_ptr,
                       row, n, M, greedy, k, k_on, top_p, min_p, stride,
                       CMAX: tl.constexpr, C: tl.constexpr):
    """The three rules and the race on a row's n <= C candidates, sorted in registers."""
    r = tl.arange(0, C)
    ok = r < n
    s = tl.load(cs_ptr + row * CMAX + r, mask=ok, other=float("-inf"))
    idx = tl.load(ci_ptr + row * CMAX + r, mask=ok, other=2147483647)
    key = (_sortable(s).to(tl.int64) << 32) | (2147483647 - idx).to(tl.int64)
    key = tl.sort(key, descending=True)
    s = _unsortable((key >> 32).to(tl.int32))
    idx = 2147483647 - (key & 0xFFFFFFFF).to(tl.int32)
    p = tl.where(ok, tl.exp(s - M), 0.0)
    tau_k = tl.sum(tl.where(r == k - 1, s, 0.0), axis=0)
    tau_k = tl.where(k_on & (k <= n), tau_k, float("-inf"))
    in_k = ok & (s >= tau_k)
    pk = tl.where(in_k, p, 0.0)
    zk = tl.where(k_on, tl.sum(pk, axis=0), tl.load(stat_ptr + row * 4 + 1))
    cum = tl.cumsum(pk, axis=0)
    m = tl.sum((in_k & (cum < top_p * zk)).to(tl.int32), axis=0)
    m = tl.minimum(m, tl.sum(in_k.to(tl.int32), axis=0) - 1)
    tau_p = tl.sum(tl.where(r == m, s, 0.0), axis=0)
    keep = tl.where(top_p >= 1.0, in_k, in_k & (s >= tau_p)) & (p >= min_p)
    keep = tl.where(greedy, r == 0, keep)
    g = _gumbel(tl.load(seed_ptr + row), tl.load(step_ptr + row), idx)
    score = tl.where(keep, tl.where(greedy, 0.0, s + g), float("-inf"))
    best = tl.max(score, axis=0)
    tok = tl.min(tl.where(keep & (score == best), idx, 2147483647), axis=0)
    tok = tl.where(tok == 2147483647, 0, tok)  # a row of -inf / NaN only: 0, as torch.argmax
    x = tl.load(x_ptr + row.to(tl.int64) * stride + tok).to(tl.float32)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, x - tl.load(stat_ptr + row * 4 + 2))


@triton.jit
def _finish(x_ptr, t_ptr, k_ptr, p_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, plan_ptr,
            cs_ptr, ci_ptr, thr_ptr, tok_ptr, lp_ptr, V, stride, CMAX: tl.constexpr,
            C_SMALL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
            EARLY: tl.constexpr = True):
    # PDL (the group-max "sampler" chain): EARLY, the dependents launch at the start; else
    # once every program has either found its row drawn already or finished its work
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    n = tl.load(plan_ptr + row * 2 + 1)
    M = tl.load(stat_ptr + row * 4)
    greedy = tl.load(t_ptr + row) < 1e-5
    inv_t = _inv_temperature(t_ptr, row)
    k = _top_k(k_ptr, row, V)
    top_p = tl.load(p_ptr + row)
    min_p = tl.load(minp_ptr + row)
    k_on = (k > 0) & (k < V)
    if tl.load(plan_ptr + row * 2) < 0:  # the group-max plan already drew this row
        if PDL and not EARLY:
            gdc_launch_dependents()
    elif n <= C_SMALL:
        _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr, tok_ptr, lp_ptr,
                           row, n, M, greedy, k, k_on, top_p, min_p, stride, CMAX, C_SMALL)
    elif n <= CMAX:
        _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr, tok_ptr, lp_ptr,
                           row, n, M, greedy, k, k_on, top_p, min_p, stride, CMAX, CMAX)
    else:
        # exact thresholds by bisection over sortable keys, one pass over the row per step
        top = _sortable(M).to(tl.int64)
        lo = tl.full((), -2147483648, tl.int64)
        if k_on & ~greedy:
            hi = top
            for _ in range(32):
                mid = lo + (hi - lo + 1) // 2
                enough = _count_ge(x_ptr, row, stride, V, inv_t, mid.to(tl.int32), BLOCK) >= k
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid - 1)
        tau_k = lo
        if (top_p < 1.0) & ~greedy:
            target = top_p * _mass_ge(x_ptr, row, stride, V, inv_t, M, tau_k.to(tl.int32), BLOCK)
            hi = top
            for _ in range(32):
                mid = lo + (hi - lo + 1) // 2
                enough = _mass_ge(x_ptr, row, stride, V, inv_t, M, mid.to(tl.int32),
                                  BLOCK) >= target
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid - 1)
        thr = tl.where(greedy, top, lo)
        tl.store(thr_ptr + row, thr.to(tl.int32))


@triton.jit
def _race_item(x_ptr, t_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, thr_ptr, rv_ptr, ri_ptr,
               V, stride, S, row, c, CHUNK: tl.constexpr):
    """The split-V race over chunk c of a row that takes the exact-threshold path."""
    greedy = tl.load(t_ptr + row) < 1e-5
    M = tl.load(stat_ptr + row * 4)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    valid = cols < V
    _, s = _scaled(x_ptr, row, cols, valid, stride, _inv_temperature(t_ptr, row))
    keep = valid & (_sortable(s) >= tl.load(thr_ptr + row)) \
        & (tl.exp(s - M) >= tl.load(minp_ptr + row))
    g = _gumbel(tl.load(seed_ptr + row), tl.load(step_ptr + row), cols)
    score = tl.where(keep, tl.where(greedy, 0.0, s + g), float("-inf"))
    best = tl.max(score, axis=0)
    tl.store(rv_ptr + row * S + c, best)
    tl.store(ri_ptr + row * S + c,
             tl.min(tl.where(keep & (score == best), cols, 2147483647), axis=0))


@triton.jit
def _race_chunk(x_ptr, t_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, plan_ptr, thr_ptr,
                rv_ptr, ri_ptr, V, stride, S, CHUNK: tl.constexpr, CMAX: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if tl.load(plan_ptr + row * 2 + 1) > CMAX:
        _race_item(x_ptr, t_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, thr_ptr, rv_ptr,
                   ri_ptr, V, stride, S, row, c, CHUNK)


@triton.jit
def _race_final(x_ptr, stat_ptr, plan_ptr, rv_ptr, ri_ptr, tok_ptr, lp_ptr, stride, S,
                CMAX: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # chained (shared/pdl.py "sampler"): dependents launch now, wait for inputs
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    if tl.load(plan_ptr + row * 2 + 1) > CMAX:
        c = tl.arange(0, BLOCK_S)
        v = tl.load(rv_ptr + row * S + c, mask=c < S, other=float("-inf"))
        i = tl.load(ri_ptr + row * S + c, mask=c < S, other=2147483647)
        best = tl.max(v, axis=0)
        tok = tl.min(tl.where((v == best) & (i < 2147483647), i, 2147483647), axis=0)
        tok = tl.where(tok == 2147483647, 0, tok)  # nothing kept (a row of -inf / NaN): 0
        x = tl.load(x_ptr + row.to(tl.int64) * stride + tok).to(tl.float32)
        tl.store(tok_ptr + row, tok.to(tl.int64))
        tl.store(lp_ptr + row, x - tl.load(stat_ptr + row * 4 + 2))


def chunk_size(vocab: int) -> int:
    """Logits per (row, chunk) program: a function of V alone, so a row's sums (and so its
    thresholds and token) never depend on the batch it is in."""
    return min(CHUNK, max(128, triton.next_power_of_2(vocab)))


PIPELINES = ("groupmax", "histogram")
# default: triton_groupmax.py (H200, B = 64 / 256: 52.3 / 142.8 us vs this module's histogram
# pipeline's 104.1 / 347.0; benchmarks/RESULTS.md, issue 23)
PIPELINE = "groupmax"


def run(logits: torch.Tensor, *, pipeline: str | None = None, **params):
    """Sample with the default pipeline, or the named one ("groupmax" / "histogram"; passing
    bins= selects the histogram one). Keyword parameters as run_histogram /
    triton_groupmax.run."""
    pipeline = pipeline or ("histogram" if "bins" in params else PIPELINE)
    if pipeline == "histogram":
        return run_histogram(logits, **params)
    if pipeline != "groupmax":
        raise ValueError(f"pipeline: expected one of {PIPELINES}, got {pipeline!r}")
    from . import triton_groupmax

    return triton_groupmax.run(logits, **params)


def run_histogram(logits: torch.Tensor, *, temperature, top_k, top_p, min_p, seeds,
                  steps=None, num_logprobs: int = 0, cmax: int = CMAX,
                  bins: tuple[int, float] = (NB, BINS_PER_UNIT)):
    """Launch the histogram pipeline (module doc); returns SampleOutput. cmax: candidate
    buffer size (tests shrink it to drive rows down the exact bisection path). bins: (number
    of histogram bins, bins per unit of logit / temperature) -- the run-verified launch is the
    default; others are for sweeps (fewer bins: cheaper histogram, a few more candidates)."""
    from tskernels_ref.sampling import SampleOutput

    batch, vocab = logits.shape
    dev = logits.device
    tok = torch.empty(batch, dtype=torch.int64, device=dev)
    lp = torch.empty(batch, dtype=torch.float32, device=dev)
    if batch == 0:
        return SampleOutput(tok, lp, None)
    steps = torch.zeros(batch, dtype=torch.int64, device=dev) if steps is None else steps
    chunk = chunk_size(vocab)
    S = triton.cdiv(vocab, chunk)
    if batch * S * bins[0] >= 2**31 or batch * cmax >= 2**31:
        raise ValueError(f"logits: {batch} rows x {S} chunks of {chunk} overflow the sampler's "
                         f"int32 workspace offsets; sample fewer rows per call")
    block_s = max(16, triton.next_power_of_2(S))
    f32 = dict(dtype=torch.float32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    part = torch.empty(batch, S, 4, **f32)
    nb, per_unit = bins
    cnt = torch.empty(batch, S, nb, **i32)
    plan = torch.empty(batch, 2, **i32)
    stat = torch.empty(batch, 4, **f32)
    off = torch.empty(batch, S, **i32)
    cs = torch.empty(batch, cmax, **f32)
    ci = torch.empty(batch, cmax, **i32)
    thr = torch.empty(batch, **i32)
    rv = torch.empty(batch, S, **f32)
    ri = torch.empty(batch, S, **i32)
    stride = logits.stride(0)
    grid2 = (batch, S)
    _stats_hist[grid2](logits, temperature, part, cnt, vocab, stride, S, CHUNK=chunk, NB=nb,
                       BINS_PER_UNIT=per_unit, num_warps=8)
    _plan[(batch,)](part, cnt, temperature, top_k, top_p, min_p, plan, stat, off, vocab, S,
                    CHUNK=chunk, NB=nb, BINS_PER_UNIT=per_unit, BLOCK_S=block_s,
                    CMAX=cmax, num_warps=8)
    _compact[grid2](logits, temperature, stat, plan, off, cs, ci, vocab, stride, S,
                    CHUNK=chunk, NB=nb, BINS_PER_UNIT=per_unit, CMAX=cmax, num_warps=8)
    _finish[(batch,)](logits, temperature, top_k, top_p, min_p, seeds, steps, stat, plan, cs,
                      ci, thr, tok, lp, vocab, stride, CMAX=cmax, C_SMALL=min(C_SMALL, cmax),
                      BLOCK=chunk, num_warps=16)
    _race_chunk[grid2](logits, temperature, min_p, seeds, steps, stat, plan, thr, rv, ri,
                       vocab, stride, S, CHUNK=chunk, CMAX=cmax, num_warps=8)
    _race_final[(batch,)](logits, stat, plan, rv, ri, tok, lp, stride, S, CMAX=cmax,
                          BLOCK_S=block_s, num_warps=1)
    top = None
    if num_logprobs > 0:  # torch.topk of the raw logits, shifted by the row's log-sum-exp
        values, ids = logits.float().topk(num_logprobs, dim=-1)
        top = (values - stat[:, 2:3], ids)
    return SampleOutput(tok, lp, top)


def _cases():
    import dataclasses

    from ..shared import pdl
    from . import triton_groupmax as gm

    base = _histogram_cases() + gm.cases()
    # the group-max pipeline's launches as the "sampler" PDL chain runs them (sm_90+)
    chain = (gm._gm_stats, gm._gm_plan, gm._gm_compact, _finish, gm._gm_race, _race_final)
    lazy = (gm._gm_compact, _finish, gm._gm_race)  # their trigger as launched (LAZY_TRIGGER)
    return base + [dataclasses.replace(
        c, constexprs=dict(c.constexprs, PDL=True,
                           **({"EARLY": not gm.LAZY_TRIGGER} if c.fn in lazy else {})),
        targets=pdl.TARGETS, label=(c.label or c.fn.__name__) + " pdl")
        for c in base if c.fn in chain]


def _histogram_cases():
    x = {"x_ptr": "*fp32", "t_ptr": "*fp32"}
    common = dict(CHUNK=CHUNK)
    bins = dict(NB=NB, BINS_PER_UNIT=BINS_PER_UNIT)
    return [
        CompileCase(_stats_hist, dict(x, part_ptr="*fp32", cnt_ptr="*i32", V="i32",
                                      stride="i32", S="i32"), dict(common, **bins), num_warps=8),
        CompileCase(_plan, {"part_ptr": "*fp32", "cnt_ptr": "*i32", "t_ptr": "*fp32",
                            "k_ptr": "*i32", "p_ptr": "*fp32", "minp_ptr": "*fp32",
                            "plan_ptr": "*i32", "stat_ptr": "*fp32", "off_ptr": "*i32",
                            "V": "i32", "S": "i32"}, dict(common, **bins, BLOCK_S=64, CMAX=CMAX),
                    num_warps=8),
        CompileCase(_compact, dict(x, stat_ptr="*fp32", plan_ptr="*i32", off_ptr="*i32",
                                   cs_ptr="*fp32", ci_ptr="*i32", V="i32", stride="i32",
                                   S="i32"), dict(common, **bins, CMAX=CMAX), num_warps=8),
        CompileCase(_finish, dict(x, k_ptr="*i32", p_ptr="*fp32", minp_ptr="*fp32",
                                  seed_ptr="*i64", step_ptr="*i64", stat_ptr="*fp32",
                                  plan_ptr="*i32", cs_ptr="*fp32", ci_ptr="*i32",
                                  thr_ptr="*i32", tok_ptr="*i64", lp_ptr="*fp32", V="i32",
                                  stride="i32"), dict(CMAX=CMAX, C_SMALL=C_SMALL, BLOCK=CHUNK),
                    num_warps=16),
        CompileCase(_race_chunk, dict(x, minp_ptr="*fp32", seed_ptr="*i64", step_ptr="*i64",
                                      stat_ptr="*fp32", plan_ptr="*i32", thr_ptr="*i32",
                                      rv_ptr="*fp32", ri_ptr="*i32", V="i32", stride="i32",
                                      S="i32"), dict(common, CMAX=CMAX), num_warps=8),
        CompileCase(_race_final, {"x_ptr": "*bf16", "stat_ptr": "*fp32", "plan_ptr": "*i32",
                                  "rv_ptr": "*fp32", "ri_ptr": "*i32", "tok_ptr": "*i64",
                                  "lp_ptr": "*fp32", "stride": "i32", "S": "i32"},
                    dict(CMAX=CMAX, BLOCK_S=64), num_warps=1),
    ]


@register("sampling", "sample", **TRITON, formats=FORMATS, tags=("deterministic",),
          compile_cases=_cases)
def sample(logits, **params):
    """Triton sort-free top-k / top-p / min-p sampling, Philox-seeded per request."""
    return run(logits, **params)
