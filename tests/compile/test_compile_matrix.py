"""Compile matrix: every Triton kernel AOT-compiles for sm_90, sm_100, sm_120, gfx942 and
gfx950; kernels using tl.dot contain the target's matrix instruction (wgmma / tcgen05 / mma /
mfma); registers, spills and shared memory are recorded in build/compile_matrix.json.

The compiler runs in one subprocess without TRITON_INTERPRET (this test session runs the
interpreter tier, whose @triton.jit objects cannot be compiled)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tskernels
from tskernels.compile import TARGETS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "compile_matrix.json"


@pytest.fixture(scope="module")
def records():
    OUT.parent.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run([sys.executable, "-m", "tskernels.compile", "--json", str(OUT)],
                          env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    print(proc.stdout[-20000:])
    assert OUT.exists(), proc.stderr[-4000:]
    return json.loads(OUT.read_text())


def test_every_triton_kernel_in_matrix(records):
    triton = {k.name for k in tskernels.kernels() if k.backend == "triton"}
    compiled = {r["kernel"] for r in records}
    assert triton and triton <= compiled, f"missing from the matrix: {triton - compiled}"
    for r in records:
        assert r["declared"], f"{r['kernel']} does not declare {r['target']}"


@pytest.mark.parametrize("target", list(TARGETS))
def test_target(records, target):
    rows = [r for r in records if r["target"] == target]
    assert rows
    failed = [f"{r['case']}: {r['error'][:600]}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    for r in rows:
        if r["uses_dot"]:
            assert r["matrix"], f"{r['case']} on {target}: no matrix instruction"
        if target.startswith("sm_"):
            assert r["registers"] and 0 < r["registers"] <= 255, r
        assert not r["spill_bytes"] or r["spill_bytes"] < 4096, \
            f"{r['case']} on {target}: {r['spill_bytes']} bytes spilled"
