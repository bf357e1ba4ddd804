"""The GDN prefill's overlapped launches (tuning "overlap", tskernels/ops/gdn/triton_chunk.py)
rely on memory-ordering instructions that no CPU test can run: in the sm_90 PTX, the state
kernel triggers its dependents and publishes a chunk as CTA barrier -> one thread's release add
at GPU scope; the output kernel (and, with "all", the state kernel) read the counter with an
acquire at GPU scope and pass a CTA barrier before loading what it guards. The compile runs in
a subprocess without TRITON_INTERPRET (as the compile matrix does); run as a script, this file
prints the checked PTX facts as JSON."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ("state", "state_stages", "state_overlap", "state_overlap_all", "output_overlap", "wy_apply_overlap_all")
RELEASE = re.compile(r"bar\.sync 0;\s*mov\.b32 %r\d+, 0;.*?atom\.global\.gpu\.release\.add", re.S)
ACQUIRE = re.compile(r"(ld|atom)\.global\.gpu\.acquire\.[a-z0-9.]+[^\n]*\n(?:[^\n]*\n){0,12}?"
                     r"[^\n]*bar\.sync\s+0;", re.S)


def facts() -> dict:
    from tskernels.compile import compile_case
    from tskernels.ops.gdn import triton_chunk as tc

    out = {}
    cases = tc._cases()
    # the plain state kernel at the flagged one's stage count (its shared memory is the bar)
    plain = next(c for c in cases if c.label == "state")
    cases.append(dataclasses.replace(plain, num_stages=tc.OVERLAP_STATE_STAGES,
                                     label="state_stages"))
    for case in cases:
        if case.label in CASES and case.builds_for("sm_90"):
            r = compile_case(case, "sm_90")
            out[case.label] = {"shared": r.shared_bytes,
                               "trigger": "griddepcontrol.launch_dependents" in r.asm,
                               "release": bool(RELEASE.search(r.asm)),
                               "acquire": bool(ACQUIRE.search(r.asm)),
                               "plain_release": "atom.global.gpu.release" in r.asm}
    return out


def test_overlap_ptx_orders_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    f = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(f) == set(CASES), f
    # the plain state kernel publishes nothing; the flagged ones trigger and publish with a
    # barrier before the release, keeping the plain kernel's pipelined shared memory at their
    # stage count ("output": OVERLAP_STATE_STAGES, "all": Triton's default 3)
    assert not f["state"]["plain_release"] and not f["state"]["trigger"]
    for name in ("state_overlap", "state_overlap_all", "wy_apply_overlap_all"):
        assert f[name]["trigger"] and f[name]["release"], (name, f[name])
    assert f["state_overlap_all"]["shared"] == f["state"]["shared"]
    assert f["state_overlap"]["shared"] == f["state_stages"]["shared"]
    # (pipelining lost would also make the stage counts alike: 28 KB at any count)
    assert f["state_stages"]["shared"] < f["state"]["shared"]
    # the waits: acquire, then a barrier before the guarded loads
    for name in ("output_overlap", "state_overlap_all"):
        assert f[name]["acquire"], (name, f[name])


if __name__ == "__main__":
    print(json.dumps(facts()))
