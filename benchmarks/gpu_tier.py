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


def _from_log(log: str, cmd: list[str]):
    """A stopped run: rebuild the JUnit tree from the collected items and the -v log lines.
    Items that never reported count as failed ("did not finish")."""
    import re
    rest, skip = [], False
    for a in cmd[3:]:  # collect in-process: no xdist, no verbose tree, no report file
        if not skip and a not in ("-v", "-n") and not a.startswith("--junitxml"):
            rest.append(a)
        skip = a == "-n"
    coll = subprocess.run([*cmd[:3], "--collect-only", "-q", *rest], capture_output=True,
                          text=True).stdout
    ids = [ln.strip() for ln in coll.splitlines() if "::" in ln]
    status = {}
    for m in re.finditer(r"(PASSED|FAILED|ERROR|SKIPPED) (\S+::\S+)", open(log).read()):
        status[m.group(2)] = m.group(1)
    root = ET.Element("testsuite")
    for nid in ids:
        path, _, name = nid.partition("::")
        tc = ET.SubElement(root, "testcase", classname=path.removesuffix(".py").replace("/", "."),
                           name=name)
        st = status.get(nid)
        if st in (None, "FAILED", "ERROR"):
            ET.SubElement(tc, "failure", message=st or "did not finish")
        elif st == "SKIPPED":
            ET.SubElement(tc, "skipped")
    return root


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pytest-arg", action="append", default=[],
                    help="extra pytest argument (e.g. -n 8)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds before pytest is stopped (the run is then recorded as failed)")
    ap.add_argument("--kernel", action="append", required=True,
                    help="KERNEL_NAME=tests/path.py[::test_name,...]")
    args = ap.parse_args()
    kernels = {}
    for spec in args.kernel:
        name, _, tests = spec.partition("=")
        kernels[name] = tests.split(",")
    files = sorted({t.split("::")[0] for ts in kernels.values() for t in ts})
    xml = args.out + ".junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", f"--junitxml={xml}",
           *args.pytest_arg, *files]
    t0 = time.time()
    log = args.out.removesuffix(".json") + ".log"  # streamed: survives a stopped run
    with open(log, "w") as f:
        try:
            returncode = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                        timeout=args.timeout).returncode
            root = ET.parse(xml).getroot()
        except subprocess.TimeoutExpired:
            returncode, root = "timeout", _from_log(log, cmd)
    with open(log) as f:
        print(f.read()[-6000:])
    cases = []
    for tc in root.iter("testcase"):
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
           "pytest_exit": returncode, "passed": passed,
           "tests": [{"file": c[0], "test": c[1], "failed": c[2], "skipped": c[3]} for c in cases]}
    import triton
    res["triton"] = triton.__version__
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(passed, indent=1))
    return 0 if returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
