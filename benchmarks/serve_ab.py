"""Run benchmarks/serve_gpu_bench.py with module-level kernel switches set first, so one GPU run
can time a decode step with and without a kernel change (the switches are read when the CUDA
graphs are captured):

    python benchmarks/serve_ab.py --set tskernels.ops.gemm.triton_gemv.USE_PDL=0 -- \
        --batch 1 --new-tokens 48 --no-hf --json out.json

Values are Python literals (0 / 1 / 8 ...) or expressions of the module's own names
(`triton_direct.DEFAULT=DirectTiles(down="token")`). The JSON gets a "switches" field.
"""
from __future__ import annotations

import ast
import importlib
import json
import runpy
import sys
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    command = "python benchmarks/serve_ab.py " + " ".join(argv)
    if "--" not in argv:
        raise SystemExit("usage: serve_ab.py [--set module.NAME=value ...] -- <serve args>")
    cut = argv.index("--")
    own, rest = argv[:cut], argv[cut + 1:]
    switches = {}
    for i, a in enumerate(own):
        if a == "--set":
            path, _, value = own[i + 1].partition("=")
            mod, _, name = path.rpartition(".")
            m = importlib.import_module(mod)
            if not hasattr(m, name):
                raise SystemExit(f"--set: {mod} has no attribute {name}")
            try:
                v = ast.literal_eval(value)
            except (ValueError, SyntaxError):  # an expression of the module's own names
                v = eval(value, vars(m))  # noqa: S307 - lab switches typed by hand
            setattr(m, name, v)
            switches[path] = repr(getattr(m, name))  # JSON-safe (tuple keys)
    print(f"switches: {switches}", flush=True)
    bench = Path(__file__).with_name("serve_gpu_bench.py")
    sys.argv = [str(bench), *rest]
    runpy.run_path(str(bench), run_name="__main__")
    if "--json" in rest:
        out = Path(rest[rest.index("--json") + 1])
        if out.exists():
            doc = json.loads(out.read_text())
            doc["switches"] = switches
            doc["command"] = command
            out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
