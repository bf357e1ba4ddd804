"""Resource regression check of the Triton compile matrix: tests/compile/resources.json keeps,
per (kernel, case, target), the registers (VGPRs on AMD), spill bytes (AMD: scratch) and shared
memory (LDS) of the compiled kernel. A case fails when it starts spilling or spills more than
recorded, or when its shared memory leaves the target's limit (tskernels.compile.SHARED_LIMIT)
where the record had it inside; a new case must not spill at all. Registers are recorded for
reading, not checked (a kernel change moves them legitimately). Cases recorded with scratch on
gfx942 / gfx950 or over a target's shared memory are the known gaps (H200-sized configs
compiled for other archs): they may shrink, never grow, and no new one may appear.

The records are the ones test_compile_matrix.py wrote to build/compile_matrix.json earlier in
the same session (it sorts first); run alone, this file runs the matrix itself. After a
deliberate change: `TSKERNELS_UPDATE_RESOURCES=1 pytest tests/compile/test_compile_resources.py`
rewrites the file; review its diff (a grown spill needs a reason in the commit message)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tskernels.compile import SHARED_LIMIT

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "build" / "compile_matrix.json"
RESOURCES = Path(__file__).with_name("resources.json")
_SESSION_START = time.time()  # (module import = collection, before any test ran)


def _key(r: dict) -> str:
    return f"{r['kernel']}|{r['case']}|{r['target']}"


@pytest.fixture(scope="module")
def current() -> dict[str, dict]:
    if not MATRIX.exists() or MATRIX.stat().st_mtime < _SESSION_START:
        MATRIX.parent.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
        proc = subprocess.run([sys.executable, "-m", "tskernels.compile", "--json", str(MATRIX)],
                              env=env, capture_output=True, text=True, timeout=2400, cwd=ROOT)
        assert MATRIX.exists(), proc.stderr[-4000:]
    return {_key(r): r for r in json.loads(MATRIX.read_text()) if r.get("ok")}


def _summary(r: dict) -> dict:
    return {"registers": r["registers"], "spill_bytes": r["spill_bytes"] or 0,
            "shared_bytes": r["shared_bytes"],
            "fits": r["shared_bytes"] <= SHARED_LIMIT[r["target"]]}


def test_resources_do_not_regress(current):
    if os.environ.get("TSKERNELS_UPDATE_RESOURCES") == "1":
        doc = {"_comment": "python -m tskernels.compile records (Triton 3.6.0): registers (AMD: "
                           "VGPRs), spill bytes (AMD: scratch), shared memory (AMD: LDS) and "
                           "whether it fits the target (tskernels.compile.SHARED_LIMIT); "
                           "checked by tests/compile/test_compile_resources.py",
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

