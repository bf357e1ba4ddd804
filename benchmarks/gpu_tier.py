"""Run the GPU tier for a set of kernels and record which passed (evidence for verified.json).

    python benchmarks/gpu_tier.py --out $OUT/gpu_tier_foundation.json \
        --kernel norm.rmsnorm.triton=tests/kernels/test_norm.py ...

Runs `pytest -m gpu` once over the named test files (larger hypothesis profile), parses the
JUnit XML, and marks a kernel passed when at least one of its tests ran and none failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pytest-arg", action="append", default=[],
                    help="extra pytest argument (e.g. -n 8)")
    ap.add_argument("--kernel", action="append", required=True,
                    help="KERNEL_NAME=tests/path.py[::test_name,...]")
    args = ap.parse_args()
    kernels = {}
    for spec in args.kernel:
        name, _, tests = spec.partition("=")
        kernels[name] = tests.split(",")
    files = sorted({t.split("::")[0] for ts in kernels.values() for t in ts})
    xml = args.out + ".junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", f"--junitxml={xml}",
           *args.pytest_arg, *files]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    cases = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        failed = any(c.tag in ("failure", "error") for c in tc)
        skipped = any(c.tag == "skipped" for c in tc)
        path = tc.get("classname", "").replace(".", "/") + ".py"
        cases.append((path, tc.get("name"), failed, skipped))
    passed = {}
    for name, tests in kernels.items():
        mine = [c for c in cases for t in tests
                if c[0].endswith(t.split("::")[0]) and
                ("::" not in t or c[1].split("[")[0] in t.split("::")[1].split("|"))]
        ran = [c for c in mine if not c[3]]
        passed[name] = bool(ran) and not any(c[2] for c in ran)
    props = torch.cuda.get_device_properties(0)
    import os
    res = {"hypothesis_profile": os.environ.get("HYPOTHESIS_PROFILE", "gpu (conftest default)"),
           "target": f"sm_{props.major}{props.minor}", "device": props.name,
           "date": time.strftime("%Y-%m-%d"), "command": " ".join(cmd),
           "torch": torch.__version__, "seconds": round(time.time() - t0, 1),
           "pytest_exit": proc.returncode, "passed": passed,
           "tests": [{"file": c[0], "test": c[1], "failed": c[2], "skipped": c[3]} for c in cases]}
    import triton
    res["triton"] = triton.__version__
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(passed, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
