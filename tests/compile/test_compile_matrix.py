"""Compile matrix: every Triton kernel AOT-compiles for sm_90, sm_100, sm_120, gfx942 and
gfx950; kernels using tl.dot contain the target's matrix instruction (wgmma / tcgen05 / mma /
mfma); registers, spills and shared memory are recorded in build/compile_matrix.json.

The compiler runs in one subprocess without TRITON_INTERPRET (this test session runs the
interpreter tier, whose @triton.jit objects cannot be compiled).

Resource regression check on the same records: tests/compile/resources.json keeps, per (kernel,
case, target), the registers (VGPRs on AMD), spill bytes (AMD: scratch) and shared memory (LDS)
of the compiled kernel. A case fails when it starts spilling or spills more than recorded, or
when its shared memory leaves the target's limit (tskernels.compile.SHARED_LIMIT) where the
record had it inside; a new case must not spill at all. Registers are recorded for reading, not
checked (a kernel change moves them legitimately). Cases recorded with scratch on gfx942 /
gfx950 or over a target's shared memory are the known gaps (H200-sized configs compiled for
other archs): they may shrink, never grow, and no new one may appear. Both checks live in this
one module so that one pytest(-xdist) worker compiles the matrix once. After a deliberate
change: `TSKERNELS_UPDATE_RESOURCES=1 pytest tests/compile/test_compile_matrix.py -k resources`
rewrites the file; review its diff (a grown spill needs a reason in the commit message)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tskernels
from tskernels.compile import SHARED_LIMIT, TARGETS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "compile_matrix.json"
RESOURCES = Path(__file__).with_name("resources.json")


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


def _key(r: dict) -> str:
    return f"{r['kernel']}|{r['case']}|{r['target']}"


def _summary(r: dict) -> dict:
    return {"registers": r["registers"], "spill_bytes": r["spill_bytes"] or 0,
            "shared_bytes": r["shared_bytes"],
            "fits": r["shared_bytes"] <= SHARED_LIMIT[r["target"]]}


def test_resources_do_not_regress(records):
    current = {_key(r): r for r in records if r.get("ok")}
    if os.environ.get("TSKERNELS_UPDATE_RESOURCES") == "1":
        doc = {"_comment": "python -m tskernels.compile records (Triton 3.6.0): registers (AMD: "
                           "VGPRs), spill bytes (AMD: scratch), shared memory (AMD: LDS) and "
                           "whether it fits the target (tskernels.compile.SHARED_LIMIT); "
                           "checked by tests/compile/test_compile_matrix.py",
               **{k: _summary(r) for k, r in sorted(current.items())}}
        RESOURCES.write_text(json.dumps(doc, indent=1) + "\n")
    recorded = json.loads(RESOURCES.read_text())
    bad = []
    for key, r in sorted(current.items()):
        now, rec = _summary(r), recorded.get(key)
        if rec is None:
            if now["spill_bytes"]:
                bad.append(f"{key}: a new case spills {now['spill_bytes']} bytes")
            continue
        if now["spill_bytes"] > rec["spill_bytes"]:
            bad.append(f"{key}: spills {now['spill_bytes']} bytes, recorded {rec['spill_bytes']}")
        if rec["fits"] and not now["fits"]:
            bad.append(f"{key}: {now['shared_bytes']} bytes of shared memory, over the "
                       f"{SHARED_LIMIT[r['target']]} of {r['target']} (recorded "
                       f"{rec['shared_bytes']})")
    assert not bad, "\n".join(bad)

