"""Independent checks of a Scheduler and its Plans, shared by the scheduler tests. They use
only the public Python surface (arrays, page_states, page_refcounts, request_pages), so they
do not trust the C++ check_invariants() they run beside."""
from __future__ import annotations

from collections import Counter

import numpy as np

import scheduler


def check_pages(s: scheduler.Scheduler, live_ids: set[int]) -> None:
    """Each page is exactly one of free / cached / used, and refcounts equal owners."""
    states, refcounts = s.page_states(), s.page_refcounts()
    n = s.config.num_pages
    assert states.shape == (n,) and refcounts.shape == (n,)
    assert states[0] == scheduler.PAGE_NULL and refcounts[0] == 0
    owners = Counter(p for rid in live_ids for p in s.request_pages(rid))
    assert 0 not in owners, "null page handed to a request"
    for page in range(1, n):
        assert refcounts[page] == owners[page], (page, refcounts[page], owners[page])
        assert (states[page] == scheduler.PAGE_USED) == (owners[page] > 0), page
    st = s.stats()
    assert st["free_pages"] == int((states == scheduler.PAGE_FREE).sum())
    assert st["cached_pages"] == int((states == scheduler.PAGE_CACHED).sum())
    assert st["used_pages"] == int((states == scheduler.PAGE_USED).sum())
    assert st["free_pages"] + st["cached_pages"] + st["used_pages"] == n - 1
    assert st["prefix_hit_tokens"] <= st["prefix_query_tokens"]
    assert st["running"] + st["waiting"] == len(live_ids)


def check_plan(s: scheduler.Scheduler, plan: scheduler.Plan, tokens: dict[int, list[int]],
               limits: dict[int, tuple[int, int]] | None = None) -> None:
    """Plan arrays agree with each other, with the requests' tokens and with their pages.
    `tokens[rid]` is prompt + outputs as the caller has seen them; `limits[rid]` (prompt
    length, max_new_tokens), when given, lets the next-slot column be checked exactly."""
    cfg = s.config
    ps, R = cfg.page_size, len(plan)
    max_len = min(cfg.max_context, (cfg.num_pages - 1) * ps + 1)
    assert plan.next_slot_mapping.dtype == np.int64 and plan.next_slot_mapping.shape == (R,)
    rids, qo = plan.request_ids, plan.qo_indptr
    T = int(qo[-1])
    assert rids.dtype == np.int64 and plan.input_ids.dtype == np.int32
    assert plan.slot_mapping.dtype == np.int64 and plan.sample.dtype == np.bool_
    assert qo.shape == (R + 1,) and qo[0] == 0 and np.all(np.diff(qo) >= 1)
    assert plan.input_ids.shape == plan.positions.shape == plan.slot_mapping.shape == (T,)
    assert len(set(rids.tolist())) == R
    assert np.array_equal(plan.seq_lens, plan.cached_lens + np.diff(qo))
    assert plan.page_table.shape[0] == R
    written = Counter()
    for i, rid in enumerate(rids.tolist()):
        state = s.request_state(rid)
        lo, hi = int(qo[i]), int(qo[i + 1])
        cached, seq = int(plan.cached_lens[i]), int(plan.seq_lens[i])
        toks = tokens[rid]
        if i < plan.num_decode:
            assert state == "Decoding" and hi - lo == 1 and plan.sample[i]
        else:
            assert state == "Prefilling"
            assert bool(plan.sample[i]) == (seq == len(toks))
        assert seq <= len(toks) and cached < len(toks)
        assert plan.input_ids[lo:hi].tolist() == toks[cached:seq]
        assert plan.positions[lo:hi].tolist() == list(range(cached, seq))
        pages = s.request_pages(rid)
        n_pages = -(-seq // ps)
        # a decode row may hold the page of its next position too (decode_reserve_tokens)
        extra = s.decode_reserve_tokens if i < plan.num_decode else 0
        assert n_pages <= len(pages) <= -(-(seq + extra) // ps), (rid, seq, pages)
        row = plan.page_table[i].tolist()
        assert row[:len(pages)] == pages and all(p == 0 for p in row[len(pages):])
        nxt = int(plan.next_slot_mapping[i])
        held = len(pages) * ps > seq
        slot = pages[seq // ps] * ps + seq % ps if held else -2
        if limits is None:   # -1 is right for a row that ends here
            assert nxt == -1 or (plan.sample[i] and nxt == slot), (rid, nxt)
        else:
            prompt_len, max_new = limits[rid]
            go_on = bool(plan.sample[i]) and seq + 1 < max_len and seq + 1 - prompt_len < max_new
            assert nxt == (slot if go_on else -1), (rid, nxt)
        pos = np.arange(cached, seq)
        expect = np.asarray(pages, dtype=np.int64)[pos // ps] * ps + pos % ps
        assert np.array_equal(plan.slot_mapping[lo:hi], expect)
        written.update(set((expect // ps).tolist()))
    refcounts = s.page_refcounts()
    for page in written:  # K/V is only ever written into a page nobody else reads
        assert refcounts[page] == 1, f"page {page} is written while shared"
    assert all(rid not in set(rids.tolist()) for rid in plan.retracted.tolist())
    for rid in plan.retracted.tolist():
        assert s.request_state(rid) == "Retracted"
