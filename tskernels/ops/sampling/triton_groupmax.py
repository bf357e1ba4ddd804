"""The sampler's group-max pipeline: one full read of the logits, the rest on a few hundred.

Same kept set, noise and race as triton_sample.py (whose histogram pipeline it replaces by
default); what changes is how the candidate superset of the kept set {s >= tau} is found.
The histogram pass cost ~115 instructions per logit (tl.histogram's ballots) and a second
full read compacted the candidates; here:
  1. _gm_stats (B x S), the one full read: per-chunk max / sum of exp of s and of the raw
     logits, and the max of every group of G consecutive logits.
  2. _gm_plan (B), from the S x CHUNK / G group maxima alone, a lower bound L <= tau:
     top-k: at least k groups have a max >= L, so at least k logits do, so tau_k >= L
     (bisection on the group maxima); top-p without top-k: the group maxima above L alone
     carry top_p of the mass, so tau_p >= L; min-p: L = M + log(min_p) exactly (minus a
     rounding margin). Only the groups whose max reaches L can hold candidates: when at most
     GMAX do, the program gathers them (a few KB; half the lanes when they fit in GMAX / 2),
     compacts s >= L and, for <= C_SMALL candidates, finishes the row itself (in-register
     sort of C_SMALL / 2 or C_SMALL keys, exact rules, Gumbel race:
     triton_sample._finish_candidates) -- the common top-k / min-p case is two launches of
     work. Otherwise it leaves the row to
  3. _gm_compact: rows with more selected groups, reading only those groups, writing
     candidates behind a per-row atomic counter (their order is irrelevant: they are sorted),
  4. triton_sample._finish / _gm_race / _race_final: the <= CMAX candidate sort, or the
     exact bisection + split-V race for rows with no useful bound (temperature only, a
     nucleus wider than the buffer) over more than GMAX groups; a row without a bound that
     has at most GMAX groups (a small vocabulary) is gathered whole as its candidates (it
     took the bisection, 64 passes over the row, before).
The fallback stages 3 and 4 run on two programs per SM that leave at once when no row needs
them (their (row, chunk) grids cost 7 + 3 us of empty programs at B = 64, 27 + 8 at 256).
A row's bound, candidate set and sums depend on its own logits only (CHUNK is a function of
V; the launch configs are fixed), so tokens do not depend on the batch, as before.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...platform import platform_of
from ..shared import pdl as _pdl
from . import triton_sample as ts
from .triton_sample import _finish_candidates, _inv_temperature, _scaled, _top_k

G = 64  # logits per group
GMAX = 128  # groups the plan program gathers itself
# bisection steps over a window of WINDOW units of s below the row max: 10 (to 1/16 unit)
# beat 16 by ~1 / 3 us at B = 64 / 256 (H200, session 14); a coarser bound only adds a few
# candidates (the same tokens)
ITERS = 10
PLAN_WARPS = 4  # two plan programs per SM (216 registers at 8 warps: one): B = 256 in one wave
WINDOW = 64.0
# the "sampler" PDL chain: the fallback stages (compaction, finish, race) trigger their
# dependents only when they have no work (False: at their start, like the other stages;
# H200, benchmarks/RESULTS.md session 25: that made the rows that take those stages 6-10 %
# slower, the waiting dependents resident beside the work)
LAZY_TRIGGER = True
MINP_MARGIN = 1e-3  # min-p bound below M + log(min_p): exp / log rounding
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _gm_stats(x_ptr, t_ptr, part_ptr, gm_ptr, V, stride, S, CHUNK: tl.constexpr,
              G: tl.constexpr, PDL: tl.constexpr = False):
    """One read of a chunk as [CHUNK / G, G]: group maxima, chunk max and sums of exp.
    s = x / T is monotone in x, so the maxima are taken on the raw logits and scaled once
    per group (max(x) * c == max(x * c) exactly), and both sums share d = x - max(x):
    sum exp(s - m) = sum 2^(d * c * log2 e), sum exp(x - rm) = sum 2^(d * log2 e)."""
    if PDL:  # chained (shared/pdl.py "sampler"): dependents launch now, wait for inputs
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    c = tl.program_id(1)
    NG: tl.constexpr = CHUNK // G
    gi = tl.arange(0, NG)
    cols = c * CHUNK + gi[:, None] * G + tl.arange(0, G)[None, :]
    x = tl.load(x_ptr + row.to(tl.int64) * stride + cols, mask=cols < V,
                other=float("-inf")).to(tl.float32)
    inv_t = _inv_temperature(t_ptr, row)
    gx = tl.max(x, axis=1)
    rm = tl.max(gx, axis=0)
    d = x - rm  # -inf where x is -inf or past V (NaN only when the whole chunk is -inf)
    live = rm > float("-inf")
    z = tl.where(live, tl.sum(tl.sum(tl.exp2(d * (inv_t * LOG2E)), axis=1), axis=0), 0.0)
    rz = tl.where(live, tl.sum(tl.sum(tl.exp2(d * LOG2E), axis=1), axis=0), 0.0)
    p = part_ptr + (row * S + c) * 4
    tl.store(p, rm * inv_t)
    tl.store(p + 1, z)
    tl.store(p + 2, rm)
    tl.store(p + 3, rz)
    tl.store(gm_ptr + (row * S + c) * NG + gi, gx * inv_t)


@triton.jit
def _stamp(prof_ptr, row, i):
    """All warps here, then the SM's cycle counter into prof_ptr[row * 8 + i] (GPU only)."""
    tl.debug_barrier()
    t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                  is_pure=False, pack=1)
    tl.store(prof_ptr + row * 8 + i, t)


@triton.jit
def _bisect(gm, w, lo, hi, need, ITERS: tl.constexpr):
    """Largest L in [lo, hi] (to (hi - lo) / 2^ITERS) with sum(w where gm >= L) >= need, given
    that lo satisfies it."""
    for _ in range(ITERS):
        mid = lo + (hi - lo) * 0.5
        ok = tl.sum(tl.where(gm >= mid, w, 0.0), axis=0) >= need
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def _max2(a0, a1, b0, b1):
    return tl.maximum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _gm_plan(x_ptr, t_ptr, k_ptr, p_ptr, minp_ptr, seed_ptr, step_ptr, part_ptr, gm_ptr,
             stat_ptr, plan_ptr, bound_ptr, gid_ptr, cs_ptr, ci_ptr, tok_ptr, lp_ptr, prof_ptr,
             V, stride, S, CHUNK: tl.constexpr, G: tl.constexpr, BLOCK_S: tl.constexpr,
             NGP: tl.constexpr, GMAX: tl.constexpr, CMAX: tl.constexpr, C_SMALL: tl.constexpr,
             ITERS: tl.constexpr, WINDOW: tl.constexpr, MINP_MARGIN: tl.constexpr,
             GHALF: tl.constexpr, CHALF: tl.constexpr, PROF: tl.constexpr = 0,
             PDL: tl.constexpr = False):
    """Row statistics, the bound L, and the whole draw for rows with few candidate groups.
    plan[row] = (state, n): state -1 done here, 1 candidates in the buffer (n of them; n >
    CMAX: bisection), 0 _gm_compact collects them into n (zeroed here). PROF (GPU sweeps
    only): SM clock64 stamps at the stage boundaries into prof_ptr[row, 0:8]."""
    if PDL:  # chained (shared/pdl.py "sampler"): dependents launch now, wait for inputs
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    if PROF:
        _stamp(prof_ptr, row, 0)
    NG: tl.constexpr = CHUNK // G
    c = tl.arange(0, BLOCK_S)
    cok = c < S
    pp = part_ptr + (row * S + c) * 4
    m = tl.load(pp, mask=cok, other=float("-inf"))
    rm = tl.load(pp + 2, mask=cok, other=float("-inf"))
    M, RM = tl.reduce((m, rm), 0, _max2)   # (two reductions for the price of one)
    Z, RZ = tl.reduce((tl.where(cok & (m > float("-inf")),
                                tl.load(pp + 1, mask=cok, other=0.0) * tl.exp(m - M), 0.0),
                       tl.where(cok & (rm > float("-inf")),
                                tl.load(pp + 3, mask=cok, other=0.0) * tl.exp(rm - RM), 0.0)),
                      0, _add2)
    tl.store(stat_ptr + row * 4, M)
    tl.store(stat_ptr + row * 4 + 1, Z)
    tl.store(stat_ptr + row * 4 + 2, RM + tl.log(RZ))
    if PROF:
        _stamp(prof_ptr, row, 1)

    g = tl.arange(0, NGP)
    gm = tl.load(gm_ptr + row * S * NG + g, mask=g < S * NG, other=float("-inf"))
    fin = gm > float("-inf")
    one = tl.where(fin, 1.0, 0.0)
    k = _top_k(k_ptr, row, V)
    top_p = tl.load(p_ptr + row)
    min_p = tl.load(minp_ptr + row)
    greedy = tl.load(t_ptr + row) < 1e-5
    inv_t = _inv_temperature(t_ptr, row)
    k_on = (k > 0) & (k < V)
    # the window's floor if it already satisfies the rule, else the lowest finite group max
    floor = M - WINDOW
    lowest = tl.min(tl.where(fin, gm, float("inf")), axis=0)
    if PROF:
        _stamp(prof_ptr, row, 6)
    neg_inf = tl.full((), float("-inf"), tl.float32)
    L_k = neg_inf
    if k_on & (tl.sum(one, axis=0) >= k.to(tl.float32)):
        kf = k.to(tl.float32)
        lo = tl.where(tl.sum(tl.where(gm >= floor, one, 0.0), axis=0) >= kf, floor, lowest)
        L_k = _bisect(gm, one, lo, M, kf, ITERS)
    L_p = neg_inf
    mass = tl.where(fin, tl.exp(gm - M), 0.0)
    need = top_p * Z * 1.001
    if (top_p < 1.0) & ~k_on & (tl.sum(mass, axis=0) >= need):
        lo = tl.where(tl.sum(tl.where(gm >= floor, mass, 0.0), axis=0) >= need, floor, lowest)
        L_p = _bisect(gm, mass, lo, M, need, ITERS)
    L_m = tl.where(min_p > 0, M + tl.log(tl.maximum(min_p, 1e-30)) - MINP_MARGIN, neg_inf)
    # top-p renormalises over the whole top-k set: with both on, all of it is a candidate
    L = tl.where(k_on, tl.where(top_p < 1.0, L_k, tl.maximum(L_k, L_m)), tl.maximum(L_p, L_m))
    L = tl.where(greedy, M, L)
    tl.store(bound_ptr + row, L)
    if PROF:
        _stamp(prof_ptr, row, 2)

    sel_g = fin & (gm >= L)
    n_g = tl.sum(sel_g.to(tl.int32), axis=0)
    state = tl.full((), 1, tl.int32)
    n = tl.full((), CMAX + 1, tl.int32)
    if (L == float("-inf")) & (n_g > GMAX):   # no bound and a large row: exact bisection
        n = tl.full((), CMAX + 1, tl.int32)
    elif n_g <= GMAX:   # (also without a bound: a small vocabulary is all candidates)
        tl.store(gid_ptr + row * GMAX + tl.cumsum(sel_g.to(tl.int32), axis=0) - 1, g,
                 mask=sel_g)
        tl.debug_barrier()
        if PROF:
            _stamp(prof_ptr, row, 3)
        # the gather's width follows the number of groups (half the lanes when they fit)
        if n_g <= GHALF:
            n = _gather(x_ptr, gid_ptr, cs_ptr, ci_ptr, row, n_g, L, inv_t, V, stride, GMAX,
                        GHALF, G, CMAX)
        else:
            n = _gather(x_ptr, gid_ptr, cs_ptr, ci_ptr, row, n_g, L, inv_t, V, stride, GMAX,
                        GMAX, G, CMAX)
        if PROF:
            _stamp(prof_ptr, row, 4)
        if n <= C_SMALL:
            tl.debug_barrier()
            if n <= CHALF:   # a sort half as wide
                _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr,
                                   tok_ptr, lp_ptr, row, n, M, greedy, k, k_on, top_p, min_p,
                                   stride, CMAX, CHALF)
            else:
                _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr,
                                   tok_ptr, lp_ptr, row, n, M, greedy, k, k_on, top_p, min_p,
                                   stride, CMAX, C_SMALL)
            state = tl.full((), -1, tl.int32)
    elif n_g <= CMAX:
        state = tl.full((), 0, tl.int32)
        n = tl.full((), 0, tl.int32)
    tl.store(plan_ptr + row * 2, state)
    tl.store(plan_ptr + row * 2 + 1, n)
    if PROF:
        _stamp(prof_ptr, row, 5)


@triton.jit
def _gather(x_ptr, gid_ptr, cs_ptr, ci_ptr, row, n_g, L, inv_t, V, stride,
            GMAX: tl.constexpr, W: tl.constexpr, G: tl.constexpr, CMAX: tl.constexpr):
    """The logits of a row's n_g <= W selected groups (ids in gid): how many reach L, and,
    when at most CMAX do, those candidates compacted into cs / ci."""
    r = tl.arange(0, W * G)
    slot = r // G
    have = slot < n_g
    cols = tl.load(gid_ptr + row * GMAX + slot, mask=have, other=0) * G + r % G
    okc = have & (cols < V)
    _, s = _scaled(x_ptr, row, cols, okc, stride, inv_t)
    sel = okc & (s >= L)
    n = tl.sum(sel.to(tl.int32), axis=0)
    if n <= CMAX:
        pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(cs_ptr + row * CMAX + pos, s, mask=sel)
        tl.store(ci_ptr + row * CMAX + pos, cols, mask=sel)
    return n


@triton.jit
def _pending(plan_ptr, B, WORD: tl.constexpr, CMAX: tl.constexpr, BLOCK_B: tl.constexpr):
    """How many rows a fallback stage has work for: WORD 0, rows in state 0 (compaction);
    WORD 1, rows with more than CMAX candidates (exact thresholds, split-V race)."""
    n = 0
    for r0 in range(0, B, BLOCK_B):
        r = r0 + tl.arange(0, BLOCK_B)
        w = tl.load(plan_ptr + r * 2 + WORD, mask=r < B, other=1 - WORD)
        if WORD == 0:
            n += tl.sum((w == 0).to(tl.int32), axis=0)
        else:
            n += tl.sum((w > CMAX).to(tl.int32), axis=0)
    return n


@triton.jit
def _gm_compact(x_ptr, t_ptr, gm_ptr, plan_ptr, bound_ptr, cs_ptr, ci_ptr, V, stride, S, B,
                CHUNK: tl.constexpr, G: tl.constexpr, CMAX: tl.constexpr,
                BLOCK_B: tl.constexpr, PDL: tl.constexpr = False, EARLY: tl.constexpr = True):
    """Rows in state 0: candidates of their selected groups, behind an atomic count. A grid
    of a few programs per SM that leaves at once when no row is in state 0 (the common case:
    a (row, chunk) grid cost 7 / 27 us of empty programs at B = 64 / 256); otherwise they
    share the (row, chunk) items. PDL without EARLY: the dependents launch at once when no
    row needs the stage, else as the programs exit (not resident beside the work)."""
    if PDL:  # chained (shared/pdl.py "sampler"): EARLY, dependents launch now; else below
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    NG: tl.constexpr = CHUNK // G
    pending = _pending(plan_ptr, B, 0, CMAX, BLOCK_B)
    if PDL and not EARLY:
        if pending == 0:
            gdc_launch_dependents()
    if pending > 0:
        for item in range(tl.program_id(0), B * S, tl.num_programs(0)):
            row = item // S
            c = item % S
            if tl.load(plan_ptr + row * 2) == 0:
                L = tl.load(bound_ptr + row)
                r = tl.arange(0, CHUNK)
                gsel = tl.load(gm_ptr + (row * S + c) * NG + r // G) >= L
                if tl.max(gsel.to(tl.int32), axis=0) > 0:
                    cols = c * CHUNK + r
                    valid = gsel & (cols < V)
                    _, s = _scaled(x_ptr, row, cols, valid, stride,
                                   _inv_temperature(t_ptr, row))
                    sel = valid & (s >= L)
                    n = tl.sum(sel.to(tl.int32), axis=0)
                    if n > 0:
                        pos = tl.atomic_add(plan_ptr + row * 2 + 1, n) \
                            + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                        keep = sel & (pos < CMAX)
                        tl.store(cs_ptr + row * CMAX + pos, s, mask=keep)
                        tl.store(ci_ptr + row * CMAX + pos, cols, mask=keep)


@triton.jit
def _gm_race(x_ptr, t_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, plan_ptr, thr_ptr, rv_ptr,
             ri_ptr, V, stride, S, B, CHUNK: tl.constexpr, CMAX: tl.constexpr,
             BLOCK_B: tl.constexpr, PDL: tl.constexpr = False, EARLY: tl.constexpr = True):
    """triton_sample._race_chunk on the same few-programs grid as _gm_compact (PDL and EARLY
    as there)."""
    if PDL:  # chained (shared/pdl.py "sampler"): EARLY, dependents launch now; else below
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    pending = _pending(plan_ptr, B, 1, CMAX, BLOCK_B)
    if PDL and not EARLY:
        if pending == 0:
            gdc_launch_dependents()
    if pending > 0:
        for item in range(tl.program_id(0), B * S, tl.num_programs(0)):
            row = item // S
            if tl.load(plan_ptr + row * 2 + 1) > CMAX:
                ts._race_item(x_ptr, t_ptr, minp_ptr, seed_ptr, step_ptr, stat_ptr, thr_ptr,
                              rv_ptr, ri_ptr, V, stride, S, row, item % S, CHUNK)


def _fallback_programs(dev: torch.device, items: int) -> int:
    """Programs of the fallback stages: two per SM (a CUDA device), at most one per item."""
    sms = platform_of(dev).num_sms if dev.type == "cuda" else 2
    return max(1, min(items, 2 * sms))


def run(logits: torch.Tensor, *, temperature, top_k, top_p, min_p, seeds, steps=None,
        num_logprobs: int = 0, cmax: int = ts.CMAX, gmax: int = GMAX,
        tuning: dict | None = None):
    """Launch the pipeline (module doc); returns SampleOutput. cmax: candidate buffer size,
    gmax: groups the plan program gathers (tests shrink both to drive rows down the
    compaction and bisection paths); tuning: launch overrides for sweeps ("stats_warps",
    "plan_warps", "iters": bisection steps of the bound; "profile": an int64 [B, 8] tensor
    for the plan's clock64 stamps)."""
    tuning = tuning or {}
    from tskernels_ref.sampling import SampleOutput

    batch, vocab = logits.shape
    dev = logits.device
    tok = torch.empty(batch, dtype=torch.int64, device=dev)
    lp = torch.empty(batch, dtype=torch.float32, device=dev)
    if batch == 0:
        return SampleOutput(tok, lp, None)
    steps = torch.zeros(batch, dtype=torch.int64, device=dev) if steps is None else steps
    chunk = ts.chunk_size(vocab)
    S = triton.cdiv(vocab, chunk)
    # int32 offsets index the group maxima and the candidate buffers (logits use int64)
    if batch * S * (chunk // G) >= 2**31 or batch * max(cmax, gmax) >= 2**31:
        raise ValueError(f"logits: {batch} rows x {S} chunks of {chunk} overflow the sampler's "
                         f"int32 workspace offsets; sample fewer rows per call")
    block_s = max(16, triton.next_power_of_2(S))
    ngp = triton.next_power_of_2(S * (chunk // G))
    f32 = dict(dtype=torch.float32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    part = torch.empty(batch, S, 4, **f32)
    gm = torch.empty(batch, S * (chunk // G), **f32)
    stat = torch.empty(batch, 4, **f32)
    plan = torch.empty(batch, 2, **i32)
    bound = torch.empty(batch, **f32)
    gid = torch.empty(batch, gmax, **i32)
    cs = torch.empty(batch, cmax, **f32)
    ci = torch.empty(batch, cmax, **i32)
    thr = torch.empty(batch, **i32)
    rv = torch.empty(batch, S, **f32)
    ri = torch.empty(batch, S, **i32)
    stride = logits.stride(0)
    grid2 = (batch, S)
    # tuning["profile"]: an int64 [batch, 8] tensor for the plan's stage stamps (sweeps)
    prof = tuning.get("profile")
    c_small = min(ts.C_SMALL, cmax)
    # the six launches as a PDL chain (shared/pdl.py, "sampler"): each lets the next launch at
    # its start and waits for its inputs, so the launches that most rows leave empty (compact,
    # finish, race) cost no launch gap each
    ch = _pdl.launch_args(dev) if _pdl.chained("sampler") else {"PDL": False}
    # the fallback stages let their dependents launch only once they know they have no work
    # (LAZY_TRIGGER), so a stage that works has no waiting programs beside it
    fb_ch = dict(ch, EARLY=not LAZY_TRIGGER) if ch["PDL"] else ch
    _gm_stats[grid2](logits, temperature, part, gm, vocab, stride, S, CHUNK=chunk, G=G,
                     num_warps=tuning.get("stats_warps", 8), **ch)
    _gm_plan[(batch,)](logits, temperature, top_k, top_p, min_p, seeds, steps, part, gm, stat,
                       plan, bound, gid, cs, ci, tok, lp, tok if prof is None else prof, vocab,
                       stride, S, CHUNK=chunk,
                       G=G, BLOCK_S=block_s, NGP=ngp, GMAX=gmax, CMAX=cmax, C_SMALL=c_small,
                       ITERS=tuning.get("iters", ITERS), WINDOW=WINDOW,
                       MINP_MARGIN=MINP_MARGIN, GHALF=max(1, gmax // 2),
                       CHALF=max(1, c_small // 2), PROF=int(prof is not None),
                       num_warps=tuning.get("plan_warps", PLAN_WARPS), **ch)
    fb = (_fallback_programs(dev, batch * S),)
    block_b = min(1024, max(16, triton.next_power_of_2(batch)))
    _gm_compact[fb](logits, temperature, gm, plan, bound, cs, ci, vocab, stride, S, batch,
                    CHUNK=chunk, G=G, CMAX=cmax, BLOCK_B=block_b, num_warps=8, **fb_ch)
    ts._finish[(batch,)](logits, temperature, top_k, top_p, min_p, seeds, steps, stat, plan,
                         cs, ci, thr, tok, lp, vocab, stride, CMAX=cmax, C_SMALL=c_small,
                         BLOCK=chunk, num_warps=16, **fb_ch)
    _gm_race[fb](logits, temperature, min_p, seeds, steps, stat, plan, thr, rv, ri, vocab,
                 stride, S, batch, CHUNK=chunk, CMAX=cmax, BLOCK_B=block_b, num_warps=8,
                 **fb_ch)
    ts._race_final[(batch,)](logits, stat, plan, rv, ri, tok, lp, stride, S, CMAX=cmax,
                             BLOCK_S=block_s, num_warps=1, **ch)
    top = None
    if num_logprobs > 0:  # torch.topk of the raw logits, shifted by the row's log-sum-exp
        values, ids = logits.float().topk(num_logprobs, dim=-1)
        top = (values - stat[:, 2:3], ids)
    return SampleOutput(tok, lp, top)


def cases() -> list[CompileCase]:
    x = {"x_ptr": "*fp32", "t_ptr": "*fp32"}
    chunk = ts.CHUNK
    return [
        CompileCase(_gm_stats, dict(x, part_ptr="*fp32", gm_ptr="*fp32", V="i32", stride="i32",
                                    S="i32"), dict(CHUNK=chunk, G=G), num_warps=8,
                    label="gm_stats"),
        CompileCase(_gm_plan, dict(x, k_ptr="*i32", p_ptr="*fp32", minp_ptr="*fp32",
                                   seed_ptr="*i64", step_ptr="*i64", part_ptr="*fp32",
                                   gm_ptr="*fp32", stat_ptr="*fp32", plan_ptr="*i32",
                                   bound_ptr="*fp32", gid_ptr="*i32", cs_ptr="*fp32",
                                   ci_ptr="*i32", tok_ptr="*i64", lp_ptr="*fp32",
                                   prof_ptr="*i64", V="i32", stride="i32", S="i32"),
                    dict(CHUNK=chunk, G=G, BLOCK_S=64, NGP=4096, GMAX=GMAX, CMAX=ts.CMAX,
                         C_SMALL=ts.C_SMALL, ITERS=ITERS, WINDOW=WINDOW,
                         MINP_MARGIN=MINP_MARGIN, GHALF=GMAX // 2, CHALF=ts.C_SMALL // 2),
                    num_warps=PLAN_WARPS, label="gm_plan"),
        CompileCase(_gm_compact, dict(x, gm_ptr="*fp32", plan_ptr="*i32", bound_ptr="*fp32",
                                      cs_ptr="*fp32", ci_ptr="*i32", V="i32", stride="i32",
                                      S="i32", B="i32"),
                    dict(CHUNK=chunk, G=G, CMAX=ts.CMAX, BLOCK_B=256), num_warps=8,
                    label="gm_compact"),
        CompileCase(_gm_race, dict(x, minp_ptr="*fp32", seed_ptr="*i64", step_ptr="*i64",
                                   stat_ptr="*fp32", plan_ptr="*i32", thr_ptr="*i32",
                                   rv_ptr="*fp32", ri_ptr="*i32", V="i32", stride="i32",
                                   S="i32", B="i32"),
                    dict(CHUNK=chunk, CMAX=ts.CMAX, BLOCK_B=256), num_warps=8,
                    label="gm_race"),
    ]
