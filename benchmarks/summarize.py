"""Render tskernels-bench JSON files as markdown tables (for RESULTS.md).

    python benchmarks/summarize.py benchmarks/results/h200/foundation_bench_*.json
"""
from __future__ import annotations

import json
import sys


def table(res: dict) -> str:
    base = [k for k in res["rows"][0] if isinstance(res["rows"][0][k], dict)
            and k not in ("ours", "shape")]
    head = ["shape", "ours µs", "GB/s", "% copy roof"] + [f"{b} µs" for b in base] + \
        [f"ours vs {b}" for b in base]
    lines = [f"**{res['op']}** [{res.get('backend', 'selected')}] on {res['device']}, "
             f"{'CUDA-graph replay' if res['graph'] else 'eager launches'}, copy roofline "
             f"{res['copy_roofline_GBps']} GB/s, {res['date']}  ",
             f"`{res.get('command', '')}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in res["rows"]:
        o = row["ours"]
        cells = [",".join(f"{k}={v}" for k, v in row["shape"].items()), f"{o['us']:.1f}",
                 str(o["GB/s"] or "—"), str(o.get("pct_of_copy_roofline", "—"))]
        cells += [f"{row[b]['us']:.1f}" for b in base]
        cells += [f"{row[b]['speedup_of_ours']:.2f}×" for b in base]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(table(json.load(open(path))))
        print()
