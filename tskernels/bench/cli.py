"""tskernels-bench <family>.<op> [...] [--shapes 'k=v,k=v;k=v'] [--json FILE|-] [--graph] ...

Examples:
    tskernels-bench --list
    tskernels-bench norm.rmsnorm --json -
    tskernels-bench attention.decode --shapes 'B=16,L=4096;B=1,L=4096' --graph --json out.json
    # the attention benchmarks of a GPU session, eager and CUDA-graph replay, one JSON each:
    tskernels-bench attention.decode attention.extend mla.decode --modes eager,graph \
        --json-dir $OUT
    # tune (autotune): every declared space matching the ops, on their bench shapes
    tskernels-bench --tune gemm.mm norm [--repeat] [--limit 24] [--json tuned.json]
    tskernels-bench --tune                   # every kernel with a declared space
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .core import benches, run_bench


def parse_shapes(text: str | None) -> list[dict] | None:
    """'B=16,L=4096;B=1,L=4096' -> [{'B': 16, 'L': 4096}, {'B': 1, 'L': 4096}]."""
    if not text:
        return None
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        shape = {}
        for kv in part.split(","):
            key, sep, val = kv.partition("=")
            if not sep:
                raise argparse.ArgumentTypeError(f"--shapes: expected key=value, got {kv!r}")
            val = val.strip()
            try:
                shape[key.strip()] = int(val)
            except ValueError:
                try:
                    shape[key.strip()] = float(val)
                except ValueError:
                    shape[key.strip()] = val
        shapes.append(shape)
    return shapes


def _table(res: dict) -> str:
    lines = [f"{res['op']} [{res['backend']}] on {res['device']} (copy roofline {res['copy_roofline_GBps']} GB/s, "
             f"graph={res['graph']})"]
    for row in res["rows"]:
        o = row["ours"]
        shape = ",".join(f"{k}={v}" for k, v in row["shape"].items())
        if "ours_backend" in row:
            shape += f" [{row['ours_backend']}]"
        extra = "".join(f"  {k}: {v['us']:.1f}us (ours x{v['speedup_of_ours']})" if "us" in v
                        else f"  {k}: failed ({v['error']})"
                        for k, v in row.items() if isinstance(v, dict) and k not in ("ours", "shape"))
        gbps = f" {o['GB/s']} GB/s ({o.get('pct_of_copy_roofline')}% roof)" if o["GB/s"] else ""
        tf = f" {o['TFLOP/s']} TFLOP/s" if o["TFLOP/s"] else ""
        lines.append(f"  {shape:<28} ours {o['us']:.1f}us{gbps}{tf}{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tskernels-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", nargs="*", help="family.op (one or more), e.g. norm.rmsnorm")
    ap.add_argument("--list", action="store_true", help="list benchmarkable ops")
    ap.add_argument("--shapes", help="';'-separated shapes of comma-separated key=value")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--iters", type=int)
    ap.add_argument("--graph", action="store_true",
                    help="time CUDA-graph replays (>= 8 calls captured back to back per graph, "
                         "cycling the input sets; time per call)")
    ap.add_argument("--compare", default="all",
                    help="baselines to time: 'all', 'none' or comma-separated names")
    ap.add_argument("--backend", help="force our backend (e.g. triton); default: selected")
    ap.add_argument("--modes", help="comma-separated 'eager' / 'graph': run each op in each "
                                    "(default: graph with --graph, else eager)")
    ap.add_argument("--json", help="write results as JSON to FILE ('-' for stdout; a list "
                                   "when several runs)")
    ap.add_argument("--json-dir", help="write each run to DIR/<family>_<op>[_graph].json")
    ap.add_argument("--tune", action="store_true",
                    help="tune the ops' kernels (autotune spaces, their bench shapes unless "
                         "--shapes) into the user table instead of benchmarking")
    ap.add_argument("--repeat", action="store_true",
                    help="with --tune: re-tune without saving, report changed picks")
    ap.add_argument("--limit", type=int, help="with --tune: at most N configs per bucket")
    args = ap.parse_args(argv)
    if args.tune:
        return _tune(args)
    table = benches()
    if args.list or not args.op:
        for name, b in table.items():
            print(f"{name:<28} baselines: {', '.join(b.baselines) or '-'}")
        return 0
    unknown = [op for op in args.op if op not in table]
    if unknown:
        print(f"unknown op(s) {unknown}; known: {', '.join(table)}", file=sys.stderr)
        return 2
    modes = (args.modes or ("graph" if args.graph else "eager")).split(",")
    if not set(modes) <= {"eager", "graph"}:
        print(f"--modes: expected 'eager' and / or 'graph', got {args.modes!r}", file=sys.stderr)
        return 2
    base = None if args.compare == "all" else ([] if args.compare == "none"
                                                else args.compare.split(","))
    command = "tskernels-bench " + " ".join(sys.argv[1:] if argv is None else argv)
    results = []
    for op in args.op:
        for mode in modes:
            try:
                res = run_bench(op, parse_shapes(args.shapes), device=args.device,
                                iters=args.iters, graph=mode == "graph", baselines=base,
                                backend=args.backend)
            except ValueError as e:  # a bad shape / backend for this op: one line, exit 2
                print(f"tskernels-bench: {e}", file=sys.stderr)
                return 2
            res["command"] = command
            results.append(res)
            if args.json != "-":
                print(_table(res), flush=True)
            if args.json_dir:
                name = op.replace(".", "_") + ("_graph" if mode == "graph" else "")
                with open(Path(args.json_dir) / f"{name}.json", "w") as f:
                    json.dump(res, f, indent=1)
    out = results[0] if len(results) == 1 else results
    if args.json == "-":
        json.dump(out, sys.stdout, indent=1)
        print()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _tune(args) -> int:
    """--tune: `python -m autotune tune` for each op (every declared space when none)."""
    import tskernels.ops  # noqa: F401  (declares the spaces)
    from autotune import spaces
    from autotune.__main__ import main as autotune_main
    ops = args.op or sorted({k.rsplit(".", 1)[0] for k in spaces()})
    shapes = parse_shapes(args.shapes)
    rc = 0
    for i, op in enumerate(ops):
        argv = ["tune", op]
        if shapes:
            argv += ["--shapes", *(",".join(f"{k}={v}" for k, v in s.items()) for s in shapes)]
        if args.repeat:
            argv.append("--repeat")
        if args.limit:
            argv += ["--limit", str(args.limit)]
        if args.device:
            argv += ["--device", args.device]
        if args.json and args.json != "-":
            argv += ["--json", args.json if len(ops) == 1 else
                     f"{Path(args.json).with_suffix('')}.{op}.json"]
        rc = max(rc, autotune_main(argv))
    return rc


if __name__ == "__main__":
    sys.exit(main())
