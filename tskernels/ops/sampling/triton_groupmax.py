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
     GMAX do, the program gathers them (a few KB), compacts s >= L and, for <= C_SMALL
     candidates, finishes the row itself (in-register sort, exact rules, Gumbel race:
     triton_sample._finish_candidates) -- the common top-k / min-p case is two launches of
     work. Otherwise it leaves the row to
  3. _gm_compact (B x S): rows with more selected groups, reading only those groups, writing
     candidates behind a per-row atomic counter (their order is irrelevant: they are sorted),
  4. triton_sample._finish / _race_chunk / _race_final: the <= CMAX candidate sort, or the
     exact bisection + split-V race for rows with no useful bound (temperature only, a
     nucleus wider than the buffer).
A row's bound, candidate set and sums depend on its own logits only (CHUNK is a function of
V), so tokens do not depend on the batch, as before.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from . import triton_sample as ts
from .triton_sample import _finish_candidates, _inv_temperature, _scaled

G = 64  # logits per group
GMAX = 128  # groups the plan program gathers itself
ITERS = 16  # bisection steps over a window of WINDOW units of s below the row max
WINDOW = 64.0
MINP_MARGIN = 1e-3  # min-p bound below M + log(min_p): exp / log rounding


@triton.jit
def _gm_stats(x_ptr, t_ptr, part_ptr, gm_ptr, V, stride, S, CHUNK: tl.constexpr,
              G: tl.constexpr):
    """One read of a chunk as [CHUNK / G, G]: group maxima, chunk max and sums of exp."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    NG: tl.constexpr = CHUNK // G
    gi = tl.arange(0, NG)
    cols = c * CHUNK + gi[:, None] * G + tl.arange(0, G)[None, :]
    valid = cols < V
    x, s = _scaled(x_ptr, row, cols, valid, stride, _inv_temperature(t_ptr, row))
    gmax = tl.max(s, axis=1)
    m = tl.max(gmax, axis=0)
    z = tl.sum(tl.sum(tl.where(valid & (s > float("-inf")), tl.exp(s - m), 0.0), axis=1), axis=0)
    rm = tl.max(tl.max(x, axis=1), axis=0)
    rz = tl.sum(tl.sum(tl.where(valid & (x > float("-inf")), tl.exp(x - rm), 0.0), axis=1),
                axis=0)
    p = part_ptr + (row * S + c) * 4
    tl.store(p, m)
    tl.store(p + 1, z)
    tl.store(p + 2, rm)
    tl.store(p + 3, rz)
    tl.store(gm_ptr + (row * S + c) * NG + gi, gmax)


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
def _gm_plan(x_ptr, t_ptr, k_ptr, p_ptr, minp_ptr, seed_ptr, step_ptr, part_ptr, gm_ptr,
             stat_ptr, plan_ptr, bound_ptr, gid_ptr, cs_ptr, ci_ptr, tok_ptr, lp_ptr, V, stride,
             S, CHUNK: tl.constexpr, G: tl.constexpr, BLOCK_S: tl.constexpr,
             NGP: tl.constexpr, GMAX: tl.constexpr, CMAX: tl.constexpr, C_SMALL: tl.constexpr,
             ITERS: tl.constexpr, WINDOW: tl.constexpr, MINP_MARGIN: tl.constexpr):
    """Row statistics, the bound L, and the whole draw for rows with few candidate groups.
    plan[row] = (state, n): state -1 done here, 1 candidates in the buffer (n of them; n >
    CMAX: bisection), 0 _gm_compact collects them into n (zeroed here)."""
    row = tl.program_id(0)
    NG: tl.constexpr = CHUNK // G
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
    tl.store(stat_ptr + row * 4, M)
    tl.store(stat_ptr + row * 4 + 1, Z)
    tl.store(stat_ptr + row * 4 + 2, RM + tl.log(RZ))

    g = tl.arange(0, NGP)
    gm = tl.load(gm_ptr + row * S * NG + g, mask=g < S * NG, other=float("-inf"))
    fin = gm > float("-inf")
    one = tl.where(fin, 1.0, 0.0)
    k = tl.load(k_ptr + row)
    top_p = tl.load(p_ptr + row)
    min_p = tl.load(minp_ptr + row)
    greedy = tl.load(t_ptr + row) < 1e-5
    inv_t = _inv_temperature(t_ptr, row)
    k_on = (k > 0) & (k < V)
    # the window's floor if it already satisfies the rule, else the lowest finite group max
    floor = M - WINDOW
    lowest = tl.min(tl.where(fin, gm, float("inf")), axis=0)
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

    sel_g = fin & (gm >= L)
    n_g = tl.sum(sel_g.to(tl.int32), axis=0)
    state = tl.full((), 1, tl.int32)
    n = tl.full((), CMAX + 1, tl.int32)
    if L == float("-inf"):
        n = tl.full((), CMAX + 1, tl.int32)
    elif n_g <= GMAX:
        tl.store(gid_ptr + row * GMAX + tl.cumsum(sel_g.to(tl.int32), axis=0) - 1, g,
                 mask=sel_g)
        tl.debug_barrier()
        r = tl.arange(0, GMAX * G)
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
            if n <= C_SMALL:
                tl.debug_barrier()
                _finish_candidates(x_ptr, cs_ptr, ci_ptr, stat_ptr, seed_ptr, step_ptr,
                                   tok_ptr, lp_ptr, row, n, M, greedy, k, k_on, top_p, min_p,
                                   stride, CMAX, C_SMALL)
                state = tl.full((), -1, tl.int32)
    elif n_g <= CMAX:
        state = tl.full((), 0, tl.int32)
        n = tl.full((), 0, tl.int32)
    tl.store(plan_ptr + row * 2, state)
    tl.store(plan_ptr + row * 2 + 1, n)


@triton.jit
def _gm_compact(x_ptr, t_ptr, gm_ptr, plan_ptr, bound_ptr, cs_ptr, ci_ptr, V, stride, S,
                CHUNK: tl.constexpr, G: tl.constexpr, CMAX: tl.constexpr):
    """Rows in state 0: candidates of this chunk's selected groups, behind an atomic count."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    NG: tl.constexpr = CHUNK // G
    if tl.load(plan_ptr + row * 2) == 0:
        L = tl.load(bound_ptr + row)
        r = tl.arange(0, CHUNK)
        gsel = tl.load(gm_ptr + (row * S + c) * NG + r // G) >= L
        if tl.max(gsel.to(tl.int32), axis=0) > 0:
            cols = c * CHUNK + r
            valid = gsel & (cols < V)
            _, s = _scaled(x_ptr, row, cols, valid, stride, _inv_temperature(t_ptr, row))
            sel = valid & (s >= L)
            n = tl.sum(sel.to(tl.int32), axis=0)
            if n > 0:
                pos = tl.atomic_add(plan_ptr + row * 2 + 1, n) + tl.cumsum(sel.to(tl.int32),
                                                                           axis=0) - 1
                keep = sel & (pos < CMAX)
                tl.store(cs_ptr + row * CMAX + pos, s, mask=keep)
                tl.store(ci_ptr + row * CMAX + pos, cols, mask=keep)


def run(logits: torch.Tensor, *, temperature, top_k, top_p, min_p, seeds, steps=None,
        num_logprobs: int = 0, cmax: int = ts.CMAX, gmax: int = GMAX,
        tuning: dict | None = None):
    """Launch the pipeline (module doc); returns SampleOutput. cmax: candidate buffer size,
    gmax: groups the plan program gathers (tests shrink both to drive rows down the
    compaction and bisection paths); tuning: launch overrides for sweeps ({"stats_warps",
    "plan_warps"})."""
    tuning = tuning or {}
    from tskernels_ref.sampling import SampleOutput

    batch, vocab = logits.shape
    dev = logits.device
    tok = torch.empty(batch, dtype=torch.int64, device=dev)
    lp = torch.empty(batch, dtype=torch.float32, device=dev)
    if batch == 0:
        return SampleOutput(tok, lp, None)
    steps = torch.zeros(batch, dtype=torch.int64, device=dev) if steps is None else steps
    top_k = top_k.clamp(min=-1, max=vocab).to(torch.int32)
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
    c_small = min(ts.C_SMALL, cmax)
    _gm_stats[grid2](logits, temperature, part, gm, vocab, stride, S, CHUNK=chunk, G=G,
                     num_warps=tuning.get("stats_warps", 8))
    _gm_plan[(batch,)](logits, temperature, top_k, top_p, min_p, seeds, steps, part, gm, stat,
                       plan, bound, gid, cs, ci, tok, lp, vocab, stride, S, CHUNK=chunk, G=G,
                       BLOCK_S=block_s, NGP=ngp, GMAX=gmax, CMAX=cmax, C_SMALL=c_small,
                       ITERS=ITERS, WINDOW=WINDOW, MINP_MARGIN=MINP_MARGIN,
                       num_warps=tuning.get("plan_warps", 8))
    _gm_compact[grid2](logits, temperature, gm, plan, bound, cs, ci, vocab, stride, S,
                       CHUNK=chunk, G=G, CMAX=cmax, num_warps=8)
    ts._finish[(batch,)](logits, temperature, top_k, top_p, min_p, seeds, steps, stat, plan,
                         cs, ci, thr, tok, lp, vocab, stride, CMAX=cmax, C_SMALL=c_small,
                         BLOCK=chunk, num_warps=16)
    ts._race_chunk[grid2](logits, temperature, min_p, seeds, steps, stat, plan, thr, rv, ri,
                          vocab, stride, S, CHUNK=chunk, CMAX=cmax, num_warps=8)
    ts._race_final[(batch,)](logits, stat, plan, rv, ri, tok, lp, stride, S, CMAX=cmax,
                             BLOCK_S=block_s, num_warps=1)
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
                                   ci_ptr="*i32", tok_ptr="*i64", lp_ptr="*fp32", V="i32",
                                   stride="i32", S="i32"),
                    dict(CHUNK=chunk, G=G, BLOCK_S=64, NGP=4096, GMAX=GMAX, CMAX=ts.CMAX,
                         C_SMALL=ts.C_SMALL, ITERS=ITERS, WINDOW=WINDOW,
                         MINP_MARGIN=MINP_MARGIN), num_warps=8, label="gm_plan"),
        CompileCase(_gm_compact, dict(x, gm_ptr="*fp32", plan_ptr="*i32", bound_ptr="*fp32",
                                      cs_ptr="*fp32", ci_ptr="*i32", V="i32", stride="i32",
                                      S="i32"), dict(CHUNK=chunk, G=G, CMAX=ts.CMAX),
                    num_warps=8, label="gm_compact"),
    ]
