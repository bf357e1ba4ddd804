"""Randomized lifecycle test: a hypothesis RuleBasedStateMachine submits requests (many share
prefixes), aborts them (in any state, also between next_plan() and advance()) and advances
steps with random samples (random EOS / stop tokens), in caches small enough that retraction
and eviction happen all the time. After every step it checks the invariants; at teardown it
drains the scheduler and checks that every request ended Finished or Aborted with its outputs
intact and no page held."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from .scheduler_checks import check_pages, check_plan

import scheduler

EOS, STOP = 2, 3
PREFIXES = [list(range(100, 140)), list(range(100, 120)) + list(range(200, 220)),
            list(range(300, 340))]
COUNTS: Counter = Counter()


class SchedulerMachine(RuleBasedStateMachine):
    CONFIG: dict = {}

    def __init__(self):
        super().__init__()
        cfg = dict(eos_token_ids=[EOS], finished_history=10**6)
        cfg.update(self.CONFIG)
        self.s = scheduler.Scheduler(scheduler.SchedulerConfig(**cfg))
        capacity = (cfg["num_pages"] - 1) * cfg["page_size"]
        self.max_len = min(cfg["max_context"], capacity + 1)
        self.next_id = 0
        self.tokens: dict[int, list[int]] = {}   # prompt + outputs, as the events told us
        self.spec: dict[int, tuple] = {}          # prompt_len, max_new, stop ids, ignore_eos
        self.live: set[int] = set()
        self.ended: dict[int, str] = {}
        self.abort_events: list[tuple] = []      # expected at the head of the next advance()

    @rule(prefix=st.integers(0, len(PREFIXES) - 1), cut=st.integers(0, 40),
          suffix=st.lists(st.integers(4, 60), max_size=10), max_new=st.integers(1, 12),
          salt=st.sampled_from([0, 0, 0, 9]), ignore_eos=st.booleans(), use_stop=st.booleans())
    def submit(self, prefix, cut, suffix, max_new, salt, ignore_eos, use_stop):
        prompt = (PREFIXES[prefix][:cut] + suffix)[: self.max_len - 1] or [5]
        rid = self.next_id
        self.next_id += 1
        stop = [STOP] if use_stop else []
        self.s.submit(rid, prompt, max_new, stop_token_ids=stop, ignore_eos=ignore_eos,
                      cache_salt=salt)
        self.tokens[rid] = list(prompt)
        self.spec[rid] = (len(prompt), max_new, stop, ignore_eos)
        self.live.add(rid)
        COUNTS["submits"] += 1

    def _abort(self, rid: int) -> None:
        self.s.abort(rid)
        self.live.discard(rid)
        self.ended[rid] = "abort"
        self.abort_events.append((rid, -1, "abort"))

    @rule(data=st.data())
    def abort(self, data):
        if not self.tokens:
            with pytest.raises(scheduler.UnknownRequestError):
                self.s.abort(12345)
            return
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        if rid in self.live:
            self._abort(rid)
            COUNTS["aborts"] += 1
        else:
            with pytest.raises(scheduler.InvalidEventError, match=f"request {rid}: event Abort"):
                self.s.abort(rid)

    def _expected(self, rid: int, token: int) -> str | None:
        prompt_len, max_new, stop, ignore_eos = self.spec[rid]
        n = len(self.tokens[rid]) + 1
        if token in stop or (token == EOS and not ignore_eos):
            return "stop"
        if n - prompt_len >= max_new or n >= self.max_len:
            return "length"
        return None

    @rule(seed=st.integers(0, 2**32 - 1), abort_in_flight=st.booleans())
    def step(self, seed, abort_in_flight):
        self._step(np.random.default_rng(seed), abort_in_flight)

    def _step(self, rng, abort_in_flight=False, finishing=True):
        plan = self.s.next_plan()
        check_plan(self.s, plan, self.tokens,
                   {rid: sp[:2] for rid, sp in self.spec.items()})
        COUNTS["plans"] += 1
        COUNTS["retractions"] += len(plan.retracted)
        sampled = rng.integers(4, 60, size=len(plan)).astype(np.int32)
        if finishing:
            sampled[rng.random(len(plan)) < 0.08] = EOS
            sampled[rng.random(len(plan)) < 0.05] = STOP
        rids = plan.request_ids.tolist()
        if abort_in_flight and rids:
            self._abort(rids[int(rng.integers(len(rids)))])
        expected = self.abort_events
        self.abort_events = []
        for i, rid in enumerate(rids):
            if plan.sample[i] and rid in self.live:
                expected.append((rid, int(sampled[i]), self._expected(rid, int(sampled[i]))))
        events = self.s.advance(plan, sampled)
        assert events == expected
        for rid, token, reason in events:
            if token >= 0:
                self.tokens[rid].append(token)
            if reason is not None:
                self.live.discard(rid)
                self.ended[rid] = reason

    @invariant()
    def check_all(self):
        COUNTS["checked_steps"] += 1
        self.s.check_invariants()
        check_pages(self.s, self.live)
        for rid in self.live:
            assert self.s.has_request(rid)
            assert self.s.request_state(rid) in ("Waiting", "Prefilling", "Decoding", "Retracted")
            assert self.s.output_ids(rid) == self.tokens[rid][self.spec[rid][0]:]
        assert self.s.num_running + self.s.num_waiting == len(self.live)

    def teardown(self):
        rng = np.random.default_rng(0)
        for _ in range(2000):
            if not self.s.has_work():
                break
            self._step(rng, finishing=False)
            self.check_all()
        assert not self.s.has_work() and not self.live
        for rid in self.tokens:  # no request lost: each ended exactly as its events said
            state = self.s.request_state(rid)
            assert state == ("Aborted" if self.ended[rid] == "abort" else "Finished"), rid
            assert self.s.output_ids(rid) == self.tokens[rid][self.spec[rid][0]:]
        st_ = self.s.stats()
        assert st_["used_pages"] == 0 and st_["running"] == 0 and st_["waiting"] == 0


class TightCache(SchedulerMachine):  # 13 pages of 4 tokens: retraction and eviction galore
    CONFIG = dict(num_pages=14, page_size=4, max_running=4, token_budget=10, max_context=40)


class RoomyCache(SchedulerMachine):  # shared prefixes stay cached; budget-bound batches
    CONFIG = dict(num_pages=48, page_size=8, max_running=6, token_budget=24, max_context=64)


class NoPrefixCache(SchedulerMachine):
    CONFIG = dict(num_pages=10, page_size=2, max_running=3, token_budget=7, max_context=18,
                  enable_prefix_cache=False)


MIN_STEPS_PER_MACHINE = 1800  # x3 machines: >= 5,000 checked steps in CI


@pytest.mark.parametrize("machine", [TightCache, RoomyCache, NoPrefixCache],
                         ids=lambda m: m.__name__)
def test_scheduler_state_machine(machine):
    before = COUNTS["checked_steps"]
    run_state_machine_as_test(machine, settings=settings(
        max_examples=60, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    steps = COUNTS["checked_steps"] - before
    print(f"{machine.__name__}: {steps} checked steps; totals {dict(COUNTS)}")
    assert steps >= MIN_STEPS_PER_MACHINE, f"only {steps} steps ran"
