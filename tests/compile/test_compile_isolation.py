"""`python -m tskernels.compile` compiles each AMD arch in a process and Triton cache of its own
(Triton 3.6 carries fp8 lowering state across AMD archs within one process: a gfx950 build
after a gfx942 one lacked gfx950's native e4m3 conversions, a gfx942 build after a gfx950 one
emitted gfx950-only instructions); `--kernels` limits a run to some kernels. The subprocess is
replaced by a recorder here: no compiler runs."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tskernels import compile as tc


def test_each_amd_arch_compiles_apart(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, env=None, check=False, **kw):
        calls.append((cmd, env))
        target = cmd[-1]
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(
            [{"kernel": "k", "case": "c", "target": target, "declared": True, "ok": True,
              "uses_dot": False, "registers": 1, "spill_bytes": 0, "shared_bytes": 0,
              "matrix": False, "fits": True}]))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(tc.subprocess, "run", fake_run)
    monkeypatch.setattr(tc, "all_cases", lambda: [])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the CPU tier's conftest sets it)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "m.json"
    assert tc.main(["--json", str(out), "--kernels", "mla.", "gfx942", "gfx950", "sm_90"]) == 0
    assert [c[0][-1] for c in calls] == ["gfx942", "gfx950"]
    for cmd, env in calls:
        assert cmd[cmd.index("--kernels") + 1] == "mla."
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / f"tskernels-{cmd[-1]}")
    assert [r["target"] for r in json.loads(out.read_text())] == ["gfx942", "gfx950"]
    # one AMD arch alone needs no extra process
    calls.clear()
    assert tc.main(["--json", str(out), "gfx950"]) == 0 and not calls


def test_a_silent_child_is_a_failed_record(monkeypatch, tmp_path):
    monkeypatch.setattr(tc.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    monkeypatch.setattr(tc, "all_cases", lambda: [])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "m.json"
    assert tc.main(["--json", str(out), "gfx942", "gfx950"]) == 1
    recs = json.loads(out.read_text())
    assert {r["target"] for r in recs} == {"gfx942", "gfx950"} and not any(r["ok"] for r in recs)
