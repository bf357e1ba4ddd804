"""Bad input raises a clear Python exception and leaves the scheduler intact."""
from __future__ import annotations

import numpy as np
import pytest

import scheduler
from scheduler import Scheduler, SchedulerConfig

GOOD = dict(num_pages=33, page_size=4, max_running=4, token_budget=16, max_context=64,
            eos_token_ids=[2])


@pytest.mark.parametrize("field, value, match", [
    ("num_pages", 0, "num_pages must be >= 2"),
    ("num_pages", 1, "num_pages must be >= 2"),
    ("num_pages", -5, "num_pages"),
    ("page_size", 0, "page_size must be > 0"),
    ("max_running", 0, "max_running must be > 0"),
    ("max_running", -1, "max_running must be > 0"),
    ("token_budget", 0, "token_budget must be > 0"),
    ("token_budget", -16, "token_budget must be > 0"),
    ("max_context", 1, "max_context must be >= 2"),
    ("max_context", -1, "max_context"),
    ("finished_history", -1, "finished_history"),
])
def test_bad_config(field, value, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**{**GOOD, field: value})
    cfg = SchedulerConfig(**GOOD)
    setattr(cfg, field, value)  # a config edited after construction is checked again
    with pytest.raises(ValueError, match=match):
        Scheduler(cfg)


def test_config_of_a_running_scheduler_cannot_be_changed():
    s = Scheduler(SchedulerConfig(**GOOD))
    s.config.num_pages = 5  # edits a copy
    assert s.config.num_pages == 33 and s.stats()["free_pages"] == 32


def test_config_overflow_is_a_type_error():
    with pytest.raises(TypeError):
        SchedulerConfig(**{**GOOD, "num_pages": 2**40})
    with pytest.raises(ValueError, match="fit in int32"):
        SchedulerConfig(**{**GOOD, "num_pages": 2**20, "page_size": 2**12})


@pytest.fixture
def s() -> Scheduler:
    s = Scheduler(SchedulerConfig(**GOOD))
    s.submit(1, [5, 6, 7], 4)
    return s


def assert_intact(s: Scheduler) -> None:
    s.check_invariants()
    assert s.num_waiting + s.num_running == 1 and s.has_request(1)
    plan = s.next_plan()
    assert s.advance(plan, np.full(len(plan), 9, dtype=np.int32))[0][:2] == (1, 9)
    s.check_invariants()


@pytest.mark.parametrize("prompt, match", [
    ([], "empty prompt"),
    (np.zeros(0, dtype=np.int32), "empty prompt"),
    (list(range(33 * 4)), "longer than the whole KV cache"),
    (list(range(64)), "max_context=64"),
    ([5, -1, 7], r"prompt_ids\[1\] = -1"),
    ([5, 2**31], "does not fit in int32"),
])
def test_bad_prompt(s, prompt, match):
    with pytest.raises(ValueError, match=match):
        s.submit(2, prompt, 4)
    assert not s.has_request(2)
    assert_intact(s)


@pytest.mark.parametrize("prompt", [[1.5, 2.0], np.zeros((2, 2), dtype=np.int32), "abc", None])
def test_prompt_of_wrong_type(s, prompt):
    with pytest.raises(TypeError):
        s.submit(2, prompt, 4)
    assert_intact(s)


def test_bad_max_new_tokens(s):
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
            s.submit(2, [5, 6], bad)
    assert_intact(s)


def test_duplicate_request_id(s):
    with pytest.raises(ValueError, match="request 1: duplicate request id"):
        s.submit(1, [8, 9, 10, 11, 12], 3)
    assert s.output_ids(1) == []
    assert_intact(s)
    while s.has_request(1):  # run it to its max_new_tokens
        plan = s.next_plan()
        s.advance(plan, np.full(len(plan), 9, dtype=np.int32))
    assert s.request_state(1) == "Finished" and s.output_ids(1) == [9, 9, 9, 9]
    s.submit(1, [8, 9], 2)  # the id of a finished request may be reused
    assert s.has_request(1) and s.output_ids(1) == []


def test_unknown_request_id(s):
    with pytest.raises(scheduler.UnknownRequestError, match="unknown request id 77"):
        s.abort(77)
    with pytest.raises(KeyError):  # UnknownRequestError is a KeyError
        s.output_ids(77)
    with pytest.raises(KeyError):
        s.request_state(77)
    assert not s.has_request(77)
    assert_intact(s)


def test_advance_with_wrong_length_or_stale_plan(s):
    plan = s.next_plan()
    for bad in (np.zeros(0, dtype=np.int32), np.zeros(3, dtype=np.int32), []):
        with pytest.raises(ValueError, match="sampled_ids has length"):
            s.advance(plan, bad)
    with pytest.raises(ValueError, match=r"sampled_ids\[0\] = -4"):
        s.advance(plan, np.array([-4], dtype=np.int32))
    with pytest.raises(TypeError):
        s.advance(plan, np.zeros((1, 1), dtype=np.int32))
    assert s.advance(plan, np.array([9], dtype=np.int32)) == [(1, 9, None)]
    with pytest.raises(ValueError, match="latest next_plan"):
        s.advance(plan, np.array([9], dtype=np.int32))  # the same plan twice
    old = s.next_plan()
    new = s.next_plan()  # a newer plan replaces an unused one
    with pytest.raises(ValueError, match="latest next_plan"):
        s.advance(old, [9])
    assert s.advance(new, [9]) == [(1, 9, None)]
    assert s.output_ids(1) == [9, 9]
    s.check_invariants()


def test_invalid_event_names_request_state_and_event(s):
    s.abort(1)
    with pytest.raises(scheduler.InvalidEventError,
                       match="request 1: event Abort is invalid in state Aborted"):
        s.abort(1)
    assert issubclass(scheduler.InvalidEventError, RuntimeError)
    s.check_invariants()


# ---- misuse of plans (issue 17): a foreign plan raises, plan arrays are read-only -------------
PLAN_ARRAYS = ("request_ids", "input_ids", "positions", "qo_indptr", "cached_lens", "seq_lens",
               "page_table", "slot_mapping", "sample", "retracted")


def test_plan_of_another_scheduler_raises_even_when_steps_match():
    # Two schedulers at the same step number: the plan of the big one names slots the small
    # one does not have (this segfaulted when advance trusted plan.entries).
    big = Scheduler(SchedulerConfig(**{**GOOD, "max_running": 64, "num_pages": 257,
                                       "token_budget": 512}))
    small = Scheduler(SchedulerConfig(**GOOD))
    for i in range(40):
        big.submit(100 + i, [5, 6, 7], 4)
    small.submit(1, [5, 6, 7], 4)
    p_big, p_small = big.next_plan(), small.next_plan()
    assert p_big.step == p_small.step and len(p_big) == 40
    with pytest.raises(ValueError, match="another Scheduler"):
        small.advance(p_big, np.full(len(p_big), 9, dtype=np.int32))
    with pytest.raises(ValueError, match="another Scheduler"):
        big.advance(p_small, np.full(len(p_small), 9, dtype=np.int32))
    # both are intact and take their own plans
    assert small.advance(p_small, np.full(len(p_small), 9, dtype=np.int32))[0][:2] == (1, 9)
    assert len(big.advance(p_big, np.full(len(p_big), 9, dtype=np.int32))) == 40
    small.check_invariants()
    big.check_invariants()


@pytest.mark.parametrize("name", PLAN_ARRAYS)
def test_plan_arrays_are_read_only(s, name):
    plan = s.next_plan()
    arr = getattr(plan, name)
    assert not arr.flags.writeable
    if arr.size:
        with pytest.raises(ValueError, match="read-only"):
            arr.reshape(-1)[0] = arr.reshape(-1)[0]
    copy = np.array(arr)   # a copy is the caller's to edit
    assert copy.flags.writeable
    s.advance(plan, np.full(len(plan), 9, dtype=np.int32))
    assert_intact_after_step(s)


def assert_intact_after_step(s: Scheduler) -> None:
    s.check_invariants()
    plan = s.next_plan()
    assert int(plan.page_table[0, 0]) > 0 and int(plan.request_ids[0]) == 1
    s.advance(plan, np.full(len(plan), 9, dtype=np.int32))
