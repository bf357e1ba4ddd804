"""`tskernels-bench --tune` routes to the tuner: the op's declared spaces, `--shapes` in the
bench syntax, `--limit`, `--json` evidence and `--repeat` (re-tune without saving, report)."""
from __future__ import annotations

import json

from tskernels.bench.cli import main


def test_bench_tune_then_repeat(tmp_path, monkeypatch, kernel_device):
    monkeypatch.setenv("TSKERNELS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tuned.json"
    # D = 64: on a GPU (32-lane warps) merge_states' space prunes the launches with more
    # threads than 2 x D columns, so D = 16 left one candidate there and D = 64 leaves three
    shape = "N=1,H=1,D=64,dtype=" + ("fp16" if kernel_device == "cpu" else "bf16")
    argv = ["--tune", "attention.merge_states", "--shapes", shape, "--device", kernel_device,
            "--limit", "2", "--json", str(out)]
    assert main(argv) == 0
    res = json.loads(out.read_text())
    (b,) = res["buckets"]
    assert b["kernel"] == "attention.merge_states.triton" and b["timed"] == 2
    assert b["heuristic"] == {"num_warps": 1} and b["heuristic_us"] > 0
    table = next((tmp_path / "cache" / "autotune").glob("*.json"))
    saved = json.loads(table.read_text())["entries"]
    assert saved[0]["config"] == b["pick"]
    assert main(argv[:-2] + ["--repeat", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())["repeat_report"][0]
    assert rep["kernel"] == "attention.merge_states.triton" and rep["buckets"] == 1
    assert json.loads(table.read_text())["entries"] == saved      # --repeat saves nothing
