"""Lab script (session 23): the lookups that autotune's "own heuristic" rule changed, timed.

For every shipped H200 entry, the problems one to three doublings away along each integer
dimension (as the CPU probe in benchmarks/RESULTS.md); where the rule now passes over a
nearest entry, the config the chain gave before (the first fitting nearest entry) and the one
it gives now are each timed with the space's own runner (CUDA-graph timer, its rotated
inputs) and checked against the runner's reference. Prints a table, writes JSON.

    python benchmarks/s23_lookup_ab_gpu.py OUT_DIR [TIME_LIMIT_S]
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import parse_bucket, spaces
from autotune.lookup import _distance, default_lookup
from autotune.timer import cuda_graph_timer
from tskernels.tuning import Target

ROOT = Path(__file__).resolve().parents[1]


def changed_problems(target):
    sp = spaces()
    look = default_lookup()
    table = json.loads((ROOT / "autotune/tables/nvidia-h200.json").read_text())["entries"]
    seen, out = set(), []
    for e in table:
        ks = sp.get(e["kernel"])
        if ks is None:
            continue
        b = parse_bucket(e["bucket"])
        for k, v in b.items():
            if not isinstance(v, int) or k in ks.exact:
                continue
            for f in (0.125, 0.25, 0.5, 2, 4, 8):
                p = dict(b, **{k: max(1, int(v * f))})
                key = (ks.kernel, json.dumps(ks.bucket(p), sort_keys=True))
                if key in seen:
                    continue
                seen.add(key)
                c = look.choose(ks, p, "nvidia-h200", record=False, target=target)
                if not any("that bucket's heuristic" in s for s in c.skipped):
                    continue
                out.append((ks, p, _old_config(ks, p, table, target), c.config))
    return out


def _old_config(ks, p, table, target):
    """The chain before the rule: the nearest fitting entry of the shipped table."""
    dims = ks.bucket(p)
    scored = sorted((d, i) for i, e in enumerate(table) if e["kernel"] == ks.kernel
                    and (d := _distance(dims, parse_bucket(e["bucket"]), ks.exact)) is not None
                    and d <= ks.max_distance)
    for _, i in scored:
        cfg = table[i]["config"]
        if not cfg or not ks.prune or ks.prune(cfg, p, target) is None:
            return cfg
    raise AssertionError("no nearest entry")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    t0 = time.time()
    target = Target.for_arch("sm_90")
    rows = []
    for ks, p, old, new in changed_problems(target):
        if time.time() - t0 > limit:
            rows.append({"kernel": ks.kernel, "problem": p, "skipped": "time limit"})
            continue
        row = {"kernel": ks.kernel, "problem": p, "old": old, "new": new}
        runner = None
        try:
            runner = ks.runner(p, "cuda")
            for name, cfg in (("old", old), ("new", new), ("old2", old), ("new2", new)):
                if name in ("old", "new"):
                    row[f"{name}_ok"] = bool(runner.check(cfg))
                row[f"{name}_us"] = cuda_graph_timer(runner.build(cfg))
        except Exception as exc:  # noqa: BLE001 - recorded per row
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        runner = None
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
    (out / os.environ.get("AB_JSON", "s23_lookup_ab.json")).write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, indent=1))
    print(f"\n{'kernel':<28} {'problem':<52} {'old us':>9} {'new us':>9} {'new/old':>8}")
    for r in rows:
        if "old_us" in r:
            o = min(r["old_us"], r["old2_us"]); n = min(r["new_us"], r["new2_us"])
            prob = ",".join(f"{k}={v}" for k, v in r["problem"].items())
            print(f"{r['kernel']:<28} {prob[:52]:<52} {o:9.2f} {n:9.2f} {n / o:8.3f}"
                  f"{'' if r['old_ok'] and r['new_ok'] else '  CHECK FAILED'}")
        else:
            print(r["kernel"], r["problem"], r.get("error") or r.get("skipped"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
