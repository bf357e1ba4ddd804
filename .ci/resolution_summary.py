"""One line from a `pip install --dry-run --report` file: what the public index resolved the
test extra to (torch / triton / numpy and how many CUDA wheels came with torch)."""
from __future__ import annotations

import json
import sys

report = json.load(open(sys.argv[1]))
versions = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
cuda = sorted(n for n in versions if n.startswith(("nvidia-", "cuda-")))
print(f"public-index resolution of .[test]: {len(versions)} packages; "
      + ", ".join(f"{n} {versions[n]}" for n in ("torch", "triton", "numpy") if n in versions)
      + f"; {len(cuda)} nvidia/cuda wheels")
