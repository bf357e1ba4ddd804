"""Lab script: the same tskernels-bench cases timed from two source trees in one process run
each, alternating, so a refactor can be shown not to change speed (old commit vs new commit,
same device, same session). Prints ours-µs new / old per shape; JSON of every run into --out.

    # on the development machine: the old tree into an ignored folder that the device call carries
    mkdir -p .cache/old && git archive <old-commit> tskernels tskernels_ref autotune | tar -x -C .cache/old
    # on the device:
    python benchmarks/ab_bench.py --old .cache/old --new . --out $OUT \
        --op attention.decode:graph --op attention.extend:eager --op mla.decode:graph --rounds 2

Each (op, mode, round) runs `run_bench` in a fresh interpreter whose `tskernels` comes from the
given tree (an editable install's import hook is bypassed), with the registry's own choice of
backend (as the official benches: TSKERNELS_BACKEND empty).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv[1])
import tskernels
assert tskernels.__file__.startswith(sys.argv[1]), tskernels.__file__
from tskernels.bench.core import run_bench
res = run_bench(sys.argv[2], graph=sys.argv[3] == "graph", iters=int(sys.argv[4]))
res["tree"] = sys.argv[1]
json.dump(res, open(sys.argv[5], "w"), indent=1)
"""


def _run(tree: str, op: str, mode: str, iters: int, path: Path, timeout: float) -> dict:
    env = dict(os.environ, TSKERNELS_BACKEND="")
    subprocess.run([sys.executable, "-c", _CHILD, str(Path(tree).resolve()), op, mode,
                    str(iters), str(path)], env=env, check=True, timeout=timeout)
    return json.loads(path.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="source tree of the old commit")
    ap.add_argument("--new", default=".", help="source tree of the new commit")
    ap.add_argument("--op", action="append", required=True,
                    help="family.op:eager or family.op:graph (repeatable)")
    ap.add_argument("--rounds", type=int, default=1, help="old/new alternations per op")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for spec in args.op:
        op, _, mode = spec.partition(":")
        mode = mode or "eager"
        us: dict[str, list[list[float]]] = {"old": [], "new": []}
        shapes = None
        for rnd in range(args.rounds):
            for side, tree in (("old", args.old), ("new", args.new)):
                name = f"{op.replace('.', '_')}_{mode}_{side}_r{rnd}.json"
                res = _run(tree, op, mode, args.iters, out / name, args.timeout)
                shapes = [r["shape"] for r in res["rows"]]
                us[side].append([r["ours"]["us"] for r in res["rows"]])
        for i, shape in enumerate(shapes or []):
            old = min(r[i] for r in us["old"])
            new = min(r[i] for r in us["new"])
            summary.append(dict(op=op, mode=mode, shape=shape, old_us=old, new_us=new,
                                new_over_old=round(new / old, 4)))
    (out / "ab_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{'op':<18} {'mode':<6} {'shape':<34} {'old us':>9} {'new us':>9} {'new/old':>8}")
    for r in summary:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        print(f"{r['op']:<18} {r['mode']:<6} {shape:<34} {r['old_us']:9.1f} {r['new_us']:9.1f} "
              f"{r['new_over_old']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
