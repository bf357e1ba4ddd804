"""Next-page reservation (SchedulerConfig.decode_reserve_tokens = 1): a planned decode row
also holds the page of its next position, so the serving loop can launch the step after
this one before this one's ids are back (serve.model_runner.launch_lookahead).

- the randomized lifecycle machine of test_scheduler_state_machine with reservation on, in
  caches tight enough that reservations miss, retraction and eviction happen: invariants and
  the plan checks (next_slot_mapping exact) after every step, every page back at the end;
- twin runs: the same random submits / aborts / tokens through a scheduler with and without
  reservation give the same batches step by step (rows, positions, lengths, retractions,
  events): a reservation never retracts anyone nor changes who runs;
- the pressure case by hand: no page to reserve -> -2 and a miss, nobody retracted.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import scheduler
from .scheduler_checks import check_pages, check_plan
from .test_scheduler_state_machine import COUNTS, SchedulerMachine

EOS = 2


class TightReserve(SchedulerMachine):
    CONFIG = dict(num_pages=14, page_size=4, max_running=4, token_budget=10, max_context=40,
                  decode_reserve_tokens=1)


class NoPrefixReserve(SchedulerMachine):
    CONFIG = dict(num_pages=10, page_size=2, max_running=3, token_budget=7, max_context=18,
                  enable_prefix_cache=False, decode_reserve_tokens=1)


@pytest.mark.parametrize("machine", [TightReserve, NoPrefixReserve], ids=lambda m: m.__name__)
def test_reserve_state_machine(machine):
    before = COUNTS["checked_steps"]
    run_state_machine_as_test(machine, settings=settings(
        max_examples=40, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    assert COUNTS["checked_steps"] - before >= 1000


def _token(rid: int, n: int) -> int:
    """The token a request samples at length n: the same in both twins, EOS now and then."""
    h = (rid * 7919 + n * 104729) % 997
    return EOS if h < 40 else 4 + h % 50


TWIN_TOTALS = {"reservations": 0, "misses": 0, "retractions": 0}

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 30), st.integers(1, 20), st.booleans()),
    st.tuples(st.just("abort"), st.integers(0, 40)),
    st.tuples(st.just("step"), st.integers(1, 4)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=5, max_size=40), page_size=st.sampled_from([2, 4]),
       num_pages=st.integers(6, 24))
def test_twins_with_and_without_reservation_plan_the_same(ops, page_size, num_pages):
    cfg = dict(num_pages=num_pages, page_size=page_size, max_running=4, token_budget=12,
               max_context=48, enable_prefix_cache=False, eos_token_ids=[EOS],
               finished_history=10**6)
    plain = scheduler.Scheduler(scheduler.SchedulerConfig(**cfg))
    ahead = scheduler.Scheduler(scheduler.SchedulerConfig(**cfg, decode_reserve_tokens=1))
    tokens: dict[int, list[int]] = {}
    limits: dict[int, tuple[int, int]] = {}
    live: set[int] = set()
    capacity = (num_pages - 1) * page_size

    def step():
        a, b = plain.next_plan(), ahead.next_plan()
        check_plan(ahead, b, tokens, limits)
        for name in ("request_ids", "positions", "seq_lens", "cached_lens", "sample",
                     "input_ids", "retracted"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert a.num_decode == b.num_decode
        sampled = np.array([_token(r, len(tokens[r])) for r in a.request_ids.tolist()],
                           dtype=np.int32)
        ea, eb = plain.advance(a, sampled), ahead.advance(b, sampled)
        assert ea == eb
        for rid, tok, reason in ea:
            if tok >= 0:
                tokens[rid].append(tok)
            if reason is not None:
                live.discard(rid)
        ahead.check_invariants()
        check_pages(ahead, live)

    for o in ops:
        if o[0] == "submit":
            rid = len(tokens)
            prompt = [5 + (rid + k) % 40 for k in range(min(o[1], capacity, 47))]
            for s in (plain, ahead):
                s.submit(rid, prompt, o[2], ignore_eos=o[3])
            tokens[rid], limits[rid] = list(prompt), (len(prompt), o[2])
            live.add(rid)
        elif o[0] == "abort":
            rid = o[1]
            if rid in live:
                plain.abort(rid)
                ahead.abort(rid)
                live.discard(rid)
        else:
            for _ in range(o[1]):
                step()
    for _ in range(3000):
        if not plain.has_work():
            break
        step()
    assert not ahead.has_work() and ahead.stats()["used_pages"] == 0
    st_a, st_b = plain.stats(), ahead.stats()
    assert st_a["retractions"] == st_b["retractions"]
    TWIN_TOTALS["reservations"] += st_b["decode_reservations"]
    TWIN_TOTALS["misses"] += st_b["reservation_misses"]
    TWIN_TOTALS["retractions"] += st_b["retractions"]


def test_twins_exercised_reservations_misses_and_retractions():
    """The twin property above ran through the cases that matter."""
    if not TWIN_TOTALS["reservations"]:   # selected alone (-k): run the property here
        test_twins_with_and_without_reservation_plan_the_same()
    assert TWIN_TOTALS["reservations"] > 100, TWIN_TOTALS
    assert TWIN_TOTALS["misses"] > 0 and TWIN_TOTALS["retractions"] > 0, TWIN_TOTALS


def test_no_page_to_reserve_means_no_reservation_and_no_retraction():
    # 5 usable pages of 2 tokens: two 3-token prompts take 2 pages each, one page is left;
    # after the prefills both rows' next position (4) opens a page: the older row reserves
    # the last page, the younger one goes without (nobody is retracted for it)
    s = scheduler.Scheduler(scheduler.SchedulerConfig(
        num_pages=6, page_size=2, max_running=2, token_budget=8, max_context=16,
        enable_prefix_cache=False, decode_reserve_tokens=1))
    s.submit(1, [5, 6, 7], 6, ignore_eos=True)
    s.submit(2, [8, 9, 10], 6, ignore_eos=True)
    p = s.next_plan()                 # both prefills: positions 3 lie in the held pages
    assert p.next_slot_mapping.tolist() == [
        s.request_pages(1)[1] * 2 + 1, s.request_pages(2)[1] * 2 + 1]
    s.advance(p, np.array([11, 12], np.int32))
    p = s.next_plan()                 # decodes at position 3; position 4 needs a new page
    assert p.num_decode == 2 and len(p.retracted) == 0
    assert p.next_slot_mapping.tolist() == [s.request_pages(1)[2] * 2, -2]
    st_ = s.stats()
    assert st_["reservation_misses"] == 1 and st_["decode_reservations"] == 1
    assert st_["free_pages"] == 0 and st_["retractions"] == 0
    s.check_invariants()
    s.advance(p, np.array([13, 14], np.int32))
    # request 2 needs its page now and none is left: it is retracted, as it would be without
    # the reservation (request 1, older, would have taken the page in this step)
    p = s.next_plan()
    assert p.retracted.tolist() == [2] and p.request_ids.tolist() == [1]
    assert int(p.next_slot_mapping[0]) == s.request_pages(1)[2] * 2 + 1   # 5: same page
    s.check_invariants()


def test_reserved_page_is_in_the_page_table_and_freed_with_the_request():
    s = scheduler.Scheduler(scheduler.SchedulerConfig(
        num_pages=16, page_size=4, max_context=64, decode_reserve_tokens=1))
    s.submit(1, [5, 6, 7, 8], 20, ignore_eos=True)   # a full page: position 4 opens page 2
    p = s.next_plan()
    assert len(s.request_pages(1)) == 1              # a prefill reserves nothing
    assert p.next_slot_mapping.tolist() == [-2]
    s.advance(p, np.array([9], np.int32))
    for _ in range(3):                               # positions 4..6: inside page 2
        p = s.next_plan()
        assert len(s.request_pages(1)) == 2
        s.advance(p, np.array([9], np.int32))
    p = s.next_plan()                                # position 7: position 8 opens page 3
    pages = s.request_pages(1)
    assert len(pages) == 3 and p.page_table[0].tolist() == pages
    assert int(p.next_slot_mapping[0]) == pages[2] * 4
    assert s.stats()["decode_reservations"] == 1
    s.check_invariants()
    s.abort(1)                                       # between next_plan and advance
    s.advance(p, np.array([9], np.int32))
    assert s.stats()["used_pages"] == 0
    s.check_invariants()


def test_length_finish_reserves_nothing_and_toggle_at_run_time():
    s = scheduler.Scheduler(scheduler.SchedulerConfig(num_pages=16, page_size=2, max_context=64))
    assert s.decode_reserve_tokens == 0
    s.submit(1, [5, 6], 3, ignore_eos=True)           # tokens 2, 3, 4 -> ends at length 5
    p = s.next_plan()
    s.advance(p, np.array([9], np.int32))
    s.decode_reserve_tokens = 1
    p = s.next_plan()                                 # position 2 -> next 3, page held
    assert int(p.next_slot_mapping[0]) == s.request_pages(1)[1] * 2 + 1
    s.advance(p, np.array([9], np.int32))
    p = s.next_plan()                                 # position 3, its token is the last
    assert p.next_slot_mapping.tolist() == [-1] and len(s.request_pages(1)) == 2
    s.decode_reserve_tokens = 0
    assert s.advance(p, np.array([9], np.int32))[-1][2] == "length"
    s.check_invariants()
    with pytest.raises(ValueError, match="decode_reserve_tokens must be 0 or 1"):
        s.decode_reserve_tokens = 2
    with pytest.raises(ValueError, match="decode_reserve_tokens must be 0 or 1"):
        scheduler.SchedulerConfig(decode_reserve_tokens=-1)
