"""The scheduler's Python API: plans, prefix cache, stop conditions, retraction, abort."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from .scheduler_checks import check_pages, check_plan

import scheduler
from scheduler import Scheduler, SchedulerConfig

EOS = 2


def make(**kw) -> Scheduler:
    args = dict(num_pages=33, page_size=4, max_running=4, token_budget=16, max_context=64,
                enable_prefix_cache=True, eos_token_ids=[EOS], finished_history=1000)
    args.update(kw)
    return Scheduler(SchedulerConfig(**args))


class Driver:
    """Runs steps and keeps what the caller would know: tokens per request, events."""

    def __init__(self, s: Scheduler):
        self.s, self.tokens, self.outputs, self.finished = s, {}, {}, {}

    def submit(self, rid: int, prompt, max_new: int, **kw) -> None:
        self.s.submit(rid, prompt, max_new, **kw)
        self.tokens[rid], self.outputs[rid] = list(map(int, prompt)), []

    def step(self, token=7):
        plan = self.s.next_plan()
        check_plan(self.s, plan, self.tokens)
        sampled = np.full(len(plan), token, dtype=np.int32) if np.isscalar(token) else token
        events = self.s.advance(plan, sampled)
        for rid, tok, reason in events:
            if tok >= 0:
                self.tokens[rid].append(tok)
                self.outputs[rid].append(tok)
            if reason is not None:
                self.finished[rid] = reason
        self.s.check_invariants()
        check_pages(self.s, {r for r in self.tokens if self.s.has_request(r)})
        return plan, events

    def drain(self, max_steps=500) -> None:
        for _ in range(max_steps):
            if not self.s.has_work():
                return
            self.step()
        raise AssertionError("scheduler did not drain")


def test_does_not_import_torch():
    code = "import sys, scheduler; assert 'torch' not in sys.modules, 'scheduler imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_layout_chunked_prefill_and_decode():
    d = Driver(make())
    d.submit(1, list(range(10, 30)), 3)
    plan, events = d.step()
    assert plan.request_ids.tolist() == [1] and plan.num_decode == 0 and not plan.sample[0]
    assert plan.input_ids.tolist() == list(range(10, 26)) and events == []  # budget 16
    plan, events = d.step()
    assert plan.cached_lens.tolist() == [16] and plan.seq_lens.tolist() == [20]
    assert events == [(1, 7, None)]
    plan, events = d.step(np.array([9], dtype=np.int32))
    assert plan.num_decode == 1 and plan.positions.tolist() == [20]
    assert plan.input_ids.tolist() == [7]
    _, events = d.step()
    assert events == [(1, 7, "length")] and d.s.output_ids(1) == [7, 9, 7]
    assert not d.s.has_request(1) and d.s.request_state(1) == "Finished"
    assert d.s.stats()["used_pages"] == 0


def test_decode_first_then_prefill_and_budget_counts_decode_tokens():
    d = Driver(make())
    d.submit(1, [5, 6, 7], 10)
    d.step()
    d.submit(2, list(range(100, 130)), 10)
    plan, _ = d.step()
    assert plan.request_ids.tolist() == [1, 2] and plan.num_decode == 1
    assert np.diff(plan.qo_indptr).tolist() == [1, 15]


def test_prefix_hit_skips_cached_pages():
    d = Driver(make())
    prompt = list(range(10, 23))  # 13 tokens: 3 full pages
    d.submit(1, prompt, 1)
    d.step()
    d.submit(2, np.asarray(prompt, dtype=np.int32), 1)
    plan, _ = d.step()
    assert plan.cached_lens.tolist() == [12] and plan.input_ids.tolist() == [22]
    assert d.s.request_pages(2)[:3] == d.s.request_pages(2)[:3]
    st = d.s.stats()
    assert st["prefix_hit_tokens"] == 12 and st["prefix_query_tokens"] == 26
    # A fully cached prompt still computes its last page so that it can sample.
    d.submit(3, prompt[:12], 1)
    plan, _ = d.step()
    assert plan.cached_lens.tolist() == [8] and plan.seq_lens.tolist() == [12]
    # Another cache_salt is another namespace; disabling the cache disables hits.
    d.submit(4, prompt, 1, cache_salt=5)
    plan, _ = d.step()
    assert plan.cached_lens.tolist() == [0]
    d2 = Driver(make(enable_prefix_cache=False))
    for rid in (1, 2):
        d2.submit(rid, prompt, 1)
        plan, _ = d2.step()
        assert plan.cached_lens.tolist() == [0]


def test_shared_prefix_pages_are_allocated_once():
    d = Driver(make(num_pages=200, max_running=8, token_budget=32, max_context=200))
    prefix = list(range(1000, 1100))  # 25 pages
    for rid in range(8):
        d.submit(rid, prefix + [rid + 3, rid + 4], 2)
    d.drain()
    st = d.s.stats()
    # The 25 prefix pages exist once: the followers waited for the leader to compute them.
    assert st["cache_entries"] == 25 and st["prefix_deferrals"] > 0
    assert st["prefix_hit_tokens"] == 7 * 100
    assert all(len(o) == 2 for o in d.outputs.values())


def test_stop_conditions():
    d = Driver(make(max_context=8, max_running=8, token_budget=32))
    d.submit(1, [5, 6, 7], 10, stop_token_ids=[40])
    d.submit(2, [5, 6, 7], 10)
    d.submit(3, [5, 6, 7], 10, ignore_eos=True)
    d.submit(4, [5, 6, 7, 8, 9, 10], 10)  # max_context 8: room for 2 tokens
    d.submit(5, [5, 6, 7], 1)
    _, events = d.step(np.array([40, EOS, EOS, 9, 9], dtype=np.int32))
    assert events == [(1, 40, "stop"), (2, EOS, "stop"), (3, EOS, None), (4, 9, None),
                      (5, 9, "length")]
    _, events = d.step()
    assert (4, 7, "length") in events and (3, 7, None) in events
    assert d.s.output_ids(1) == [40] and d.s.output_ids(3) == [EOS, 7]


def test_retracts_youngest_and_recomputes_without_losing_outputs():
    d = Driver(make(num_pages=9, enable_prefix_cache=False))  # 8 pages: 32 tokens
    d.submit(1, list(range(10, 22)), 16)
    d.submit(2, list(range(50, 62)), 16)
    retracted = []
    for i in range(200):
        if not d.s.has_work():
            break
        plan, _ = d.step(3 + i % 5)
        retracted += plan.retracted.tolist()
    assert retracted and set(retracted) == {2}  # always the younger request
    assert d.s.stats()["retractions"] == len(retracted)
    for rid in (1, 2):
        assert len(d.outputs[rid]) == 16 and d.s.output_ids(rid) == d.outputs[rid]
        assert d.finished[rid] == "length"


def test_abort_in_every_state():
    d = Driver(make(num_pages=9, max_running=2, enable_prefix_cache=False))
    d.submit(1, list(range(10, 40)), 5)   # prefilling (chunk of 16) after one step
    d.submit(2, [5, 6, 7], 5)             # waiting: budget used by 1
    d.step()
    assert d.s.request_state(1) == "Prefilling" and d.s.request_state(2) == "Waiting"
    d.s.abort(1)
    d.s.abort(2)
    assert d.s.request_state(1) == "Aborted" and not d.s.has_request(1)
    with pytest.raises(scheduler.InvalidEventError, match="request 2: event Abort is invalid in state Aborted"):
        d.s.abort(2)
    assert d.s.has_work()  # the abort events are still to be delivered
    _, events = d.step()
    assert sorted(events) == [(1, -1, "abort"), (2, -1, "abort")]
    assert d.s.stats()["used_pages"] == 0 and not d.s.has_work()
    # Decoding, and aborted between next_plan() and advance().
    d.submit(3, [5, 6, 7], 5)
    d.step()
    assert d.s.request_state(3) == "Decoding"
    plan = d.s.next_plan()
    d.s.abort(3)
    assert d.s.advance(plan, np.full(len(plan), 7, dtype=np.int32)) == [(3, -1, "abort")]
    # Retracted: squeeze two requests into 8 pages until one is retracted, then abort it.
    d.submit(4, list(range(10, 22)), 30)
    d.submit(5, list(range(50, 62)), 30)
    for _ in range(100):
        plan, _ = d.step()
        if plan.retracted.size:
            break
    assert d.s.request_state(5) == "Retracted"
    d.s.abort(5)
    d.s.abort(4)  # decoding
    d.step()
    assert d.s.stats()["used_pages"] == 0 and d.s.stats()["running"] == 0
    d.s.check_invariants()


def test_empty_plan_is_legal():
    s = make()
    plan = s.next_plan()
    assert len(plan) == 0 and plan.input_ids.shape == (0,) and plan.page_table.shape == (0, 0)
    assert plan.qo_indptr.tolist() == [0]
    assert s.advance(plan, np.zeros(0, dtype=np.int32)) == [] and not s.has_work()


def test_plan_arrays_outlive_the_plan_and_accept_other_int_types():
    s = make()
    s.submit(1, np.array([5, 6, 7], dtype=np.int64), 4)
    plan = s.next_plan()
    ids = plan.input_ids
    assert s.advance(plan, [9]) == [(1, 9, None)]
    del plan
    assert ids.tolist() == [5, 6, 7]
    plan = s.next_plan()
    assert s.advance(plan, np.array([11], dtype=np.int64)) == [(1, 11, None)]
    assert s.output_ids(1) == [9, 11]


def test_stats_keys():
    st = make().stats()
    for key in ("num_pages", "free_pages", "cached_pages", "used_pages", "running", "waiting",
                "prefix_lookups", "prefix_hit_tokens", "prefix_query_tokens", "evictions",
                "retractions"):
        assert key in st
    assert st["free_pages"] == 32 and st["num_pages"] == 33


def test_cached_pages_are_evicted_lru_under_pressure():
    d = Driver(make(num_pages=17, max_context=64))  # 16 pages
    d.submit(1, list(range(10, 42)), 1)  # 8 pages cached after it finishes
    d.drain()
    assert d.s.stats()["cached_pages"] == 8
    d.submit(2, list(range(100, 152)), 1)  # needs 13 pages: evicts 5 cached ones
    d.drain()
    st = d.s.stats()
    assert st["evictions"] >= 5 and st["used_pages"] == 0


def test_token_array_converts_lists_and_tuples_of_ints():
    """The engine's one-pass prompt conversion: the same int32 ids numpy gives, or None."""
    ids = np.random.default_rng(0).integers(0, 1000, 5000).tolist()
    for seq in (ids, tuple(ids), [0, 999]):
        a = scheduler.token_array(seq, 1000)
        assert a.dtype == np.int32 and a.shape == (len(seq),)
        np.testing.assert_array_equal(a, np.array(seq, dtype=np.int64))
    empty = scheduler.token_array([], 10)
    assert empty.dtype == np.int32 and empty.shape == (0,)
    a = scheduler.token_array(ids, 1000)
    del ids
    assert int(a[0]) >= 0 and len(a) == 5000   # the array owns its ids


@pytest.mark.parametrize("ids", [
    [1, True], [1, 2.0], [1, np.int64(2)], [1, 10], [-1], [3, 2 ** 40], [2 ** 70],
    np.array([1, 2]), "ab", None, 7,
])
def test_token_array_is_none_for_anything_but_ints_in_range(ids):
    assert scheduler.token_array(ids, 10) is None


def test_token_array_rejects_a_bad_vocab_size():
    with pytest.raises(ValueError, match="vocab_size"):
        scheduler.token_array([1], -1)
