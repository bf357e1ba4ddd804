"""`python -m tskernels.compile` compiles each AMD arch in a process and Triton cache of its own
(Triton 3.6 carries fp8 lowering state across AMD archs within one process: a gfx950 build
after a gfx942 one lacked gfx950's native e4m3 conversions, a gfx942 build after a gfx950 one
emitted gfx950-only instructions); with several jobs (TSKERNELS_COMPILE_JOBS, default the CPU
count) every target gets a process of its own, that many at a time; `--kernels` limits a run
to some kernels. The subprocesses are replaced by a recorder here: no compiler runs."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tskernels import compile as tc


class _Recorder:
    """Stands in for subprocess.Popen: records the command and environment, writes one
    record for its target (or nothing when `silent`), and tracks how many run at once."""

    def __init__(self, silent=False):
        self.calls, self.silent, self.live, self.most = [], silent, 0, 0

    def __call__(self, cmd, env=None, stdout=None, stderr=None, **kw):
        rec = self

        class Proc:
            def __init__(self):
                rec.calls.append((cmd, env))
                rec.live += 1
                rec.most = max(rec.most, rec.live)
                self.polls, self.done = 0, False
                if stdout is not None:
                    stdout.write(f"table of {cmd[-1]}\n")
                if not rec.silent:
                    Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(
                        [{"kernel": "k", "case": "c", "target": cmd[-1], "declared": True,
                          "ok": True, "uses_dot": False, "registers": 1, "spill_bytes": 0,
                          "shared_bytes": 0, "matrix": False, "fits": True}]))

            def poll(self):
                self.polls += 1  # finishes on its second poll: the others overlap it
                if self.polls < 2:
                    return None
                if not self.done:
                    self.done = True
                    rec.live -= 1
                return 1 if rec.silent else 0

            def wait(self):
                while self.poll() is None:
                    pass
                return self.poll()
        return Proc()


def _setup(monkeypatch, tmp_path, jobs: int, silent=False) -> _Recorder:
    rec = _Recorder(silent)
    monkeypatch.setattr(tc.subprocess, "Popen", rec)
    monkeypatch.setattr(tc.subprocess, "run", lambda *a, **k: pytest.fail("subprocess.run"))
    monkeypatch.setattr(tc, "all_cases", lambda: [])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the CPU tier's conftest sets it)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TSKERNELS_COMPILE_JOBS", str(jobs))
    return rec


def test_each_amd_arch_compiles_apart(monkeypatch, tmp_path, capsys):
    rec = _setup(monkeypatch, tmp_path, jobs=1)
    out = tmp_path / "m.json"
    assert tc.main(["--json", str(out), "--kernels", "mla.", "gfx942", "gfx950", "sm_90"]) == 0
    # one job: the AMD archs apart, one at a time; sm_90 in this process
    assert [c[0][-1] for c in rec.calls] == ["gfx942", "gfx950"] and rec.most == 1
    for cmd, env in rec.calls:
        assert cmd[cmd.index("--kernels") + 1] == "mla."
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / f"tskernels-{cmd[-1]}")
        assert env["TSKERNELS_COMPILE_JOBS"] == "1"
    assert [r["target"] for r in json.loads(out.read_text())] == ["gfx942", "gfx950"]
    printed = capsys.readouterr().out
    assert printed.index("table of gfx942") < printed.index("table of gfx950")
    # one AMD arch alone needs no extra process
    rec.calls.clear()
    assert tc.main(["--json", str(out), "gfx950"]) == 0 and not rec.calls


def test_several_jobs_give_every_target_a_process(monkeypatch, tmp_path):
    rec = _setup(monkeypatch, tmp_path, jobs=2)
    out = tmp_path / "m.json"
    targets = ["sm_80", "sm_90", "gfx942", "gfx950", "sm_120"]
    assert tc.main(["--json", str(out), "--kernels", "norm.", *targets]) == 0
    assert sorted(c[0][-1] for c in rec.calls) == sorted(targets)
    assert rec.most == 2  # two at a time, never more
    for cmd, env in rec.calls:
        assert cmd[cmd.index("--kernels") + 1] == "norm."
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / f"tskernels-{cmd[-1]}")
    # records in the order the targets were named, whatever order the processes ended in
    assert [r["target"] for r in json.loads(out.read_text())] == targets


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_silent_child_is_a_failed_record(monkeypatch, tmp_path, jobs):
    _setup(monkeypatch, tmp_path, jobs=jobs, silent=True)
    out = tmp_path / "m.json"
    assert tc.main(["--json", str(out), "gfx942", "gfx950"]) == 1
    recs = json.loads(out.read_text())
    assert {r["target"] for r in recs} == {"gfx942", "gfx950"} and not any(r["ok"] for r in recs)
