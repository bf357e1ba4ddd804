"""autotune's subsystem on the CPU with injected timings: spaces and pruning, the lookup chain
(exact -> nearest bucket -> device family -> heuristic), staleness (kernel source, Triton
version), persistence, shape capture, the deterministic tie-break and the re-tune report."""
from __future__ import annotations

import json
import warnings

import pytest

from autotune import (Entry, KernelSpace, Lookup, Space, StaleTableWarning, Table, Tables, Target,
                      bucket_str, capture, current_versions, device_family, parse_bucket,
                      repeat_report, tune, tune_bucket)
from autotune.__main__ import main as cli

SRC = {"text": "def kernel(): v1"}


def _space(**kw):
    return KernelSpace(
        kernel="toy.op.triton",
        space=Space(block=[32, 64, 128, 256], warps=[4, 8]),
        key=lambda p: {"N": 1 << (p["N"] - 1).bit_length(), "dtype": p["dtype"]},
        heuristic=lambda p: {"block": 64, "warps": 4},
        prune=lambda cfg, p, t: ("smem" if cfg["block"] * 1024 > t.smem_bytes else None),
        source=lambda: SRC["text"], **kw)


def _tables(tmp_path, rows: dict[str, list[Entry]], where="shipped"):
    for dev, entries in rows.items():
        t = Table(tmp_path / where / f"{dev}.json", dev)
        for e in entries:
            t.put(e)
        t.save()
    return Tables(tmp_path / "user", tmp_path / "shipped")


def _entry(ks, bucket: dict, cfg: dict, **kw):
    return Entry(ks.kernel, bucket_str(bucket), cfg, us=1.0, source_hash=ks.source_hash(),
                 versions=dict(current_versions()), **kw)


def test_bucket_text_round_trips_and_pruning():
    ks = _space()
    dims = ks.bucket({"N": 3000, "dtype": "bf16"})
    assert dims == {"N": 4096, "dtype": "bf16"} and parse_bucket(bucket_str(dims)) == dims
    keep, pruned = ks.candidates({"N": 10}, Target.for_arch("gfx942"))     # 64 KB LDS
    assert {c["block"] for c in keep} == {32, 64} and len(pruned) == 4
    assert all(p["reason"] == "smem" for p in pruned)
    assert len(ks.candidates({"N": 10}, Target.for_arch("gfx950"))[0]) == 6   # 160 KB LDS
    assert Target.for_arch("gfx942").warp_size == 64 and Target.for_arch("sm_90").smem_bytes == 227 * 1024
    with pytest.raises(ValueError, match="family.op.backend"):
        KernelSpace("toy", Space(a=[1]), key=dict, heuristic=dict)


def test_lookup_chain_exact_nearest_family_heuristic(tmp_path):
    ks = _space()
    h100 = "nvidia-h100-80gb-hbm3"
    tables = _tables(tmp_path, {
        "nvidia-h200": [_entry(ks, {"N": 4096, "dtype": "bf16"}, {"block": 128, "warps": 8}),
                        _entry(ks, {"N": 65536, "dtype": "bf16"}, {"block": 256, "warps": 8})],
        h100: [_entry(ks, {"N": 1024, "dtype": "fp16"}, {"block": 32, "warps": 4})]})
    look = Lookup(tables)
    c = look.choose(ks, {"N": 4000, "dtype": "bf16"}, "nvidia-h200")
    assert (c.link, c.config) == ("exact", {"block": 128, "warps": 8})
    c = look.choose(ks, {"N": 8192, "dtype": "bf16"}, "nvidia-h200")     # log2 distance 1 vs 3
    assert (c.link, c.config) == ("nearest-bucket", {"block": 128, "warps": 8})
    c = look.choose(ks, {"N": 40000, "dtype": "bf16"}, "nvidia-h200")
    assert c.config == {"block": 256, "warps": 8}
    # farther than max_distance (3 doublings) from every entry: the heuristic, not a far tile
    c = look.choose(ks, {"N": 256, "dtype": "bf16"}, "nvidia-h200")       # 4 from N=4096
    assert (c.link, c.config) == ("heuristic", {"block": 64, "warps": 4})
    # fp16 exists only in the H100 table: the H200 takes it through its family
    c = look.choose(ks, {"N": 1024, "dtype": "fp16"}, "nvidia-h200")
    assert (c.link, c.config) == (f"family:{h100}", {"block": 32, "warps": 4})
    assert "family" in c.explain() and h100 in c.explain()
    # a simulated H100 sees the H200's bf16 entries the same way
    c = look.choose(ks, {"N": 4096, "dtype": "bf16"}, h100)
    assert c.link == "family:nvidia-h200"
    # another family, or a dtype nobody tuned: the heuristic
    c = look.choose(ks, {"N": 4096, "dtype": "bf16"}, "amd-mi300x")
    assert (c.link, c.config) == ("heuristic", {"block": 64, "warps": 4})
    assert look.choose(ks, {"N": 4096, "dtype": "fp32"}, "nvidia-h200").link == "heuristic"
    assert device_family("nvidia-h200") == device_family(h100) == "hopper"
    assert device_family("amd-mi325x") == device_family("amd-mi300x") == "cdna3"


def test_nearest_entry_that_is_its_buckets_heuristic_yields_to_this_problems(tmp_path):
    """A tuned entry equal to its own bucket's heuristic ("the heuristic won there") is not
    handed to a problem whose heuristic is another config; an entry that beat its heuristic
    still is, and so is one whose heuristic agrees with the problem's."""
    def heur(p):
        return {"block": 64 if p["N"] <= 2048 else 128, "warps": 4}
    ks = KernelSpace(kernel="toy.op.triton", space=Space(block=[32, 64, 128, 256], warps=[4, 8]),
                     key=lambda p: {"N": 1 << (p["N"] - 1).bit_length(), "dtype": p["dtype"]},
                     heuristic=heur, source=lambda: SRC["text"])
    tables = _tables(tmp_path, {"nvidia-h200": [
        _entry(ks, {"N": 1024, "dtype": "bf16"}, {"block": 64, "warps": 4}),     # = its heuristic
        _entry(ks, {"N": 1024, "dtype": "fp16"}, {"block": 32, "warps": 8})]})   # beat it
    look = Lookup(tables)
    c = look.choose(ks, {"N": 8192, "dtype": "bf16"}, "nvidia-h200")
    assert (c.link, c.config) == ("heuristic", {"block": 128, "warps": 4})
    assert any("that bucket's heuristic" in s for s in c.skipped)
    c = look.choose(ks, {"N": 2048, "dtype": "bf16"}, "nvidia-h200")       # same heuristic
    assert (c.link, c.config) == ("nearest-bucket", {"block": 64, "warps": 4})
    c = look.choose(ks, {"N": 8192, "dtype": "fp16"}, "nvidia-h200")
    assert (c.link, c.config) == ("nearest-bucket", {"block": 32, "warps": 8})


def test_user_entries_beat_shipped(tmp_path):
    ks = _space()
    b = {"N": 4096, "dtype": "bf16"}
    tables = _tables(tmp_path, {"nvidia-h200": [_entry(ks, b, {"block": 128, "warps": 8})]})
    _tables(tmp_path, {"nvidia-h200": [_entry(ks, b, {"block": 32, "warps": 8})]}, where="user")
    assert Lookup(tables).choose(ks, b, "nvidia-h200").config == {"block": 32, "warps": 8}


def test_stale_source_or_triton_version_is_skipped_with_one_warning(tmp_path, monkeypatch):
    ks = _space()
    b = {"N": 4096, "dtype": "bf16"}
    tables = _tables(tmp_path, {"nvidia-h200": [_entry(ks, b, {"block": 128, "warps": 8})]})
    look = Lookup(tables)
    SRC["text"] = "def kernel(): v2"                          # the kernel changed
    try:
        with pytest.warns(StaleTableWarning, match="python -m autotune tune toy.op"):
            c = look.choose(ks, b, "nvidia-h200")
        assert c.link == "heuristic" and "kernel source changed" in c.skipped[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")                    # once per table and kernel
            look.choose(ks, b, "nvidia-h200")
    finally:
        SRC["text"] = "def kernel(): v1"
    # a simulated Triton upgrade orphans the entry the same way
    bumped = dict(current_versions(), triton="99.0.0")
    monkeypatch.setattr("autotune.table.current_versions", lambda: bumped)
    with pytest.warns(StaleTableWarning):
        c = Lookup(tables).choose(ks, b, "nvidia-h200")
    assert c.link == "heuristic" and "triton" in c.skipped[0] and "99.0.0" in c.skipped[0]


def test_format1_tables_load_but_are_unversioned(tmp_path):
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "nvidia-h200.json").write_text(json.dumps(
        {"toy.op.triton": {"N=4096,dtype=bf16": {"block": 32, "warps": 4, "measured_us": 3.0}}}))
    ks = _space()
    tables = Tables(tmp_path / "user", tmp_path / "shipped")
    e = tables.layers("nvidia-h200")[1].entries[("toy.op.triton", "N=4096,dtype=bf16")]
    assert e.us == 3.0 and e.config == {"block": 32, "warps": 4}
    with pytest.warns(StaleTableWarning, match="unversioned"):
        assert Lookup(tables).choose(ks, {"N": 4096, "dtype": "bf16"}, "nvidia-h200").link == "heuristic"


class _Runner:
    """Injected timings: `times[(block, warps)]` is a list consumed one per timer call."""

    def __init__(self, times, wrong=(), broken=()):
        self.times, self.wrong, self.broken = times, set(wrong), set(broken)

    def build(self, cfg):
        key = (cfg["block"], cfg["warps"])
        if key in self.broken:
            raise RuntimeError("out of resources")
        return lambda: key

    def check(self, cfg):
        return (cfg["block"], cfg["warps"]) not in self.wrong


def _timer(runner):
    it = {k: iter(v) for k, v in runner.times.items()}
    return lambda fn: next(it[fn()])


def test_tune_bucket_ties_are_deterministic_and_failures_reported():
    ks = _space()
    base = {(b, w): [50.0, 50.0, 50.0] for b in (32, 64, 128) for w in (4, 8)}
    base[(64, 8)] = [10.1, 10.2, 10.0]       # fastest by a hair ...
    base[(64, 4)] = [10.3, 10.2, 10.4]       # ... within noise of this one, declared first
    base[(128, 4)] = [9.0, 9.0, 9.0]         # truly fastest but computes a wrong result
    runner = _Runner(base, wrong=[(128, 4)], broken=[(32, 8)])
    res = tune_bucket(ks, {"N": 64, "dtype": "fp16"}, runner, timer=_timer(runner),
                      target=Target.for_arch("sm_90"))
    assert res.pick == {"block": 64, "warps": 4} and {"block": 64, "warps": 8} in res.ties
    assert {c.error.split(":")[0] for c in res.errors} == {"wrong result (differs from the reference)",
                                                           "RuntimeError"}
    assert [p["config"]["block"] for p in res.pruned] == [256, 256]
    assert res.heuristic == {"block": 64, "warps": 4} and res.heuristic_us == pytest.approx(10.3)


def test_tune_persists_resumes_and_repeat_reproduces(tmp_path):
    times = {(b, w): [20.0] * 30 for b in (32, 64, 128) for w in (4, 8)}
    times[(128, 8)] = [5.0] * 30
    runner = _Runner(times)
    ks = _space(runner=lambda p, dev: runner)
    tables = Tables(tmp_path / "user", tmp_path / "shipped")
    probs = [{"N": 100, "dtype": "bf16"}, {"N": 120, "dtype": "bf16"}, {"N": 5000, "dtype": "bf16"}]
    res = tune(ks, probs, device="cpu", device_name="nvidia-h200", timer=_timer(runner),
               target=Target.for_arch("sm_90"), tables=tables, progress=False)
    assert [r.bucket for r in res] == ["N=128,dtype=bf16", "N=8192,dtype=bf16"]   # distinct buckets
    saved = json.loads((tmp_path / "user" / "nvidia-h200.json").read_text())
    assert saved["format"] == 2 and len(saved["entries"]) == 2
    e = saved["entries"][0]
    assert e["config"] == {"block": 128, "warps": 8} and e["source_hash"] == ks.source_hash()
    assert e["versions"].get("triton") == current_versions().get("triton")
    # resume: nothing left to do
    assert tune(ks, probs, device="cpu", device_name="nvidia-h200", timer=_timer(runner),
                target=Target.for_arch("sm_90"), tables=tables, progress=False) == []
    # the lookup now uses it
    assert Lookup(Tables(tmp_path / "user", tmp_path / "shipped")).choose(
        ks, {"N": 128, "dtype": "bf16"}, "nvidia-h200").link == "exact"
    # re-tune with noise-level differences: no pick changes
    noisy = {k: [v[0] * 1.01] * 30 for k, v in times.items()}
    noisy[(64, 4)] = [5.02] * 30             # now ties with the old pick
    r2 = _Runner(noisy)
    again = [tune_bucket(ks, p, r2, timer=_timer(r2), target=Target.for_arch("sm_90")) for p in probs[::2]]
    rep = repeat_report(ks, {r.bucket: r.pick for r in res}, again)
    assert rep.buckets == 2 and rep.changed == [] and "0 of 2" in rep.summary()
    # a real change is reported with both picks' times from the same run
    moved = {k: [30.0] * 30 for k in times}
    moved[(32, 4)] = [4.0] * 30
    r3 = _Runner(moved)
    third = [tune_bucket(ks, probs[0], r3, timer=_timer(r3), target=Target.for_arch("sm_90"))]
    rep = repeat_report(ks, {r.bucket: r.pick for r in res}, third)
    assert len(rep.changed) == 1 and rep.changed[0]["old_us"] == 30.0 and rep.changed[0]["new_us"] == 4.0
    assert rep.worst_rel_diff == pytest.approx(26 / 30)


def test_capture_counts_lookups_and_feeds_the_tuner(tmp_path):
    ks = _space()
    path = tmp_path / "shapes.json"
    capture.enable(path)
    try:
        look = Lookup(Tables(tmp_path / "user", tmp_path / "shipped"))
        for n in (100, 120, 100, 5000):
            look.choose(ks, {"N": n, "dtype": "bf16"}, "nvidia-h200")
        capture.flush()
    finally:
        capture.disable()
    rows = capture.load(path)
    assert [(r["bucket"], r["count"]) for r in rows] == [("N=128,dtype=bf16", 3), ("N=8192,dtype=bf16", 1)]
    assert rows[0]["kernel"] == "toy.op.triton" and rows[0]["device"] == "nvidia-h200"
    with pytest.raises(ValueError, match="shape-capture"):
        (tmp_path / "x.json").write_text("{}")
        capture.load(tmp_path / "x.json")


def test_cli_list_diff_prune_export(tmp_path, capsys, monkeypatch):
    ks = _space()
    from autotune import declare
    declare(ks)
    good = _entry(ks, {"N": 128, "dtype": "bf16"}, {"block": 32, "warps": 4})
    old = Entry(ks.kernel, "N=256,dtype=bf16", {"block": 64, "warps": 4}, source_hash="0" * 16)
    _tables(tmp_path, {"nvidia-h200": [good, old]}, where="user")
    args = ["--spaces-module", "autotune", "--user-dir", str(tmp_path / "user"),
            "--shipped-dir", str(tmp_path / "shipped")]
    assert cli(args + ["list", "--device", "nvidia-h200"]) == 0
    out = capsys.readouterr().out
    assert "current" in out and "kernel source changed" in out
    assert cli(args + ["prune", "--dry-run"]) == 0 and "would drop" in capsys.readouterr().out
    assert cli(args + ["prune"]) == 0
    t = Table.load(tmp_path / "user" / "nvidia-h200.json")
    assert list(t.entries) == [(ks.kernel, "N=128,dtype=bf16")]
    assert cli(args + ["export", "--device", "nvidia-h200", "-o", str(tmp_path / "e.json")]) == 0
    t2 = Table.load(tmp_path / "e.json", "nvidia-h200")
    t2.put(Entry(ks.kernel, "N=512,dtype=bf16", {"block": 32, "warps": 8}))
    t2.save()
    assert cli(args + ["diff", str(tmp_path / "user" / "nvidia-h200.json"), str(tmp_path / "e.json")]) == 0
    assert "+ toy.op.triton [N=512,dtype=bf16]" in capsys.readouterr().out
    assert cli(args + ["explain", ks.kernel, "--shape", "N=128,dtype=bf16"]) == 0
    assert "exact" in capsys.readouterr().out


def test_a_noisy_slow_config_is_no_tie_and_the_heuristic_wins_ties():
    """The H200 GPU tier's failure mode: a config declared early whose repeats spread widely
    (24-70 us) tied with the fastest by its own spread and won; now only the best's spread
    (capped at 5 %) counts, and among ties the heuristic is kept."""
    ks = _space()
    base = {(b, w): [50.0, 50.0, 50.0] for b in (32, 64, 128) for w in (4, 8)}
    base[(32, 4)] = [24.0, 70.0, 68.0]       # declared first, slow and noisy
    base[(64, 4)] = [40.0, 40.2, 39.9]       # the heuristic
    base[(64, 8)] = [39.6, 39.5, 39.7]       # a hair faster: a tie, the heuristic stays
    runner = _Runner(base, broken=[(32, 8)])
    res = tune_bucket(ks, {"N": 64, "dtype": "fp16"}, runner, timer=_timer(runner),
                      target=Target.for_arch("sm_90"))
    assert res.pick == {"block": 64, "warps": 4}
    assert {"block": 32, "warps": 4} not in res.ties and {"block": 64, "warps": 8} in res.ties
    base[(64, 8)] = [30.0, 30.1, 30.2]       # clearly faster: it wins
    runner = _Runner(base, broken=[(32, 8)])
    res = tune_bucket(ks, {"N": 64, "dtype": "fp16"}, runner, timer=_timer(runner),
                      target=Target.for_arch("sm_90"))
    assert res.pick == {"block": 64, "warps": 8}


def test_an_entry_of_the_kernels_own_choice_fits_every_problem(tmp_path):
    """A {} entry (the plan's own choice won) is used by the chain and never handed to the
    pruner (the H200 window run crashed there with KeyError before this)."""
    ks = _space()
    b = {"N": 4096, "dtype": "bf16"}
    tables = _tables(tmp_path, {"nvidia-h200": [_entry(ks, {"N": 2048, "dtype": "bf16"}, {})]})
    c = Lookup(tables).choose(ks, b, "nvidia-h200", target=Target.for_arch("sm_90"))
    assert c.link == "nearest-bucket" and c.config == {}
