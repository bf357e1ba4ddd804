"""The engine's bounded start-up tuning window (injected timer and clock, no GPU): captured
buckets without an entry are tuned most frequent first until the budget is spent, persisted
to the user table, and the next start finds them (exact link) and tunes nothing; a bucket
cut by the deadline keeps the heuristic's timing and is re-tuned by a later window."""
from __future__ import annotations

import json
import sys

import pytest

from autotune import KernelSpace, Lookup, Space, Tables, Target, capture, declare
from autotune.window import PARTIAL, tune_missing

DEV = "nvidia-h200"


class _Runner:
    def __init__(self, p, device):
        self.p = p

    def build(self, cfg):
        return lambda: cfg

    def check(self, cfg):
        return True


def _timer(fn):
    """Block 64 is fastest; each timing advances the fake clock by one second."""
    cfg = fn()
    _Clock.now += 1.0
    return {32: 3.0, 64: 1.0, 128: 2.0}[cfg["block"]]


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def space():
    ks = declare(KernelSpace(
        "window.toy.triton", Space(block=[32, 64, 128]), key=lambda p: {"N": p["N"]},
        heuristic=lambda p: {"block": 128}, runner=_Runner, source=lambda: "def toy(): pass",
        example={"N": 1}))
    yield ks
    sys.modules["autotune.declare"]._SPACES.pop(ks.kernel, None)


def _rows(*pairs):
    return [{"kernel": "window.toy.triton", "device": DEV, "bucket": f"N={n}", "count": c}
            for n, c in pairs] + [{"kernel": "window.unknown.triton", "device": DEV,
                                   "bucket": "N=1", "count": 99},
                                  {"kernel": "window.toy.triton", "device": "other-gpu",
                                   "bucket": "N=7", "count": 5}]


def test_window_tunes_missing_buckets_within_budget_and_persists(space, tmp_path):
    tables = Tables(tmp_path / "user", tmp_path / "shipped")
    _Clock.now = 0.0
    # 3 timings per config x 3 configs = 9 s per bucket; 9 s budget: the most frequent
    # bucket (N=2) completes, N=1 is reached with no time left and not started
    rep = tune_missing(_rows((1, 3), (2, 10)), budget_s=9, device="cpu", device_name=DEV,
                       target=Target(), timer=_timer, tables=tables, clock=_Clock())
    assert [t["bucket"] for t in rep.tuned] == ["N=2"]
    assert rep.tuned[0]["pick"] == {"block": 64} and not rep.tuned[0]["partial"]
    assert rep.tuned[0]["heuristic_us"] == 2.0
    assert any(s["why"] == "no declared space" for s in rep.skipped)
    assert rep.left == 1 and "1 left" in rep.summary()
    saved = json.loads((tmp_path / "user" / f"{DEV}.json").read_text())
    assert [e["bucket"] for e in saved["entries"]] == ["N=2"]
    # the next start: N=2 has an exact entry, N=1 gets its turn
    _Clock.now = 0.0
    rep2 = tune_missing(_rows((1, 3), (2, 10)), budget_s=100, device="cpu", device_name=DEV,
                        target=Target(), timer=_timer, tables=Tables(tmp_path / "user",
                                                                     tmp_path / "shipped"),
                        clock=_Clock())
    assert [t["bucket"] for t in rep2.tuned] == ["N=1"]
    assert {"kernel": "window.toy.triton", "bucket": "N=2", "why": "has an entry"} in rep2.skipped
    look = Lookup(Tables(tmp_path / "user", tmp_path / "shipped"))
    for n in (1, 2):
        c = look.choose(space, {"N": n}, DEV, record=False)
        assert c.link == "exact" and c.config == {"block": 64}


def test_deadline_inside_a_bucket_keeps_the_heuristic_and_marks_partial(space, tmp_path):
    tables = Tables(tmp_path / "user", tmp_path / "shipped")
    _Clock.now = 0.0
    rep = tune_missing(_rows((4, 1)), budget_s=2, device="cpu", device_name=DEV,
                       target=Target(), timer=_timer, tables=tables, clock=_Clock())
    assert rep.tuned == [{"kernel": "window.toy.triton", "bucket": "N=4", "pick": {"block": 128},
                          "us": 2.0, "heuristic_us": 2.0, "partial": True}]
    saved = json.loads((tmp_path / "user" / f"{DEV}.json").read_text())
    assert saved["entries"][0]["evidence"] == PARTIAL
    _Clock.now = 0.0                       # a later window with time: tuned again, fully
    rep2 = tune_missing(_rows((4, 1)), budget_s=100, device="cpu", device_name=DEV,
                        target=Target(), timer=_timer,
                        tables=Tables(tmp_path / "user", tmp_path / "shipped"), clock=_Clock())
    assert rep2.tuned[0]["pick"] == {"block": 64} and not rep2.tuned[0]["partial"]


def test_engine_start_runs_the_window_from_the_capture_file(space, tmp_path, monkeypatch):
    from tskernels.tuning import engine_start
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"format": 1, "shapes": [
        {"kernel": "window.toy.triton", "device": "cpu", "bucket": "N=3", "count": 2}]}))
    _Clock.now = 0.0
    tables = Tables(tmp_path / "user", tmp_path / "shipped")
    try:
        rep = engine_start(str(path), 60, "cpu", timer=_timer, tables=tables, clock=_Clock())
        assert capture.enabled()
    finally:
        capture.disable()
    assert [t["bucket"] for t in rep.tuned] == ["N=3"]
    assert engine_start(None, 0, "cpu") is None              # no window asked for
    with pytest.raises(ValueError, match="budget_s"):
        tune_missing([], budget_s=0, device="cpu", device_name=DEV, target=Target(),
                     timer=_timer)


def test_engine_args_take_the_flags():
    from serve.config import EngineArgs
    a = EngineArgs(capture_shapes="/tmp/x.json", tune_window_s=30)
    assert a.capture_shapes == "/tmp/x.json" and a.tune_window_s == 30
    with pytest.raises(ValueError, match="tune_window_s"):
        EngineArgs(tune_window_s=-1)
    from serve.cli import build_parser, engine_kwargs
    ns = build_parser().parse_args(["--capture-shapes", "s.json", "--tune-window", "45"])
    kw = engine_kwargs(ns)
    assert kw["capture_shapes"] == "s.json" and kw["tune_window_s"] == 45.0


def test_a_broken_capture_file_never_stops_the_engine(tmp_path):
    from tskernels.tuning import engine_start
    path = tmp_path / "shapes.json"
    tables = Tables(tmp_path / "u", tmp_path / "s")
    try:
        for text in ('{"format": 1, "shapes": [{"kernel": "x"}]}', "not json"):
            path.write_text(text)
            with pytest.warns(UserWarning, match="capture"):
                rep = engine_start(str(path), 10, "cpu", timer=_timer, tables=tables)
            assert rep is None and capture.enabled()       # counting starts afresh
            capture.disable()
    finally:
        capture.disable()
