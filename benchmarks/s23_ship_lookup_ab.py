"""Lab script (session 23): ship, as exact entries of autotune/tables/nvidia-h200.json, the
winner of every bucket timed by benchmarks/s23_lookup_ab_gpu.py
(benchmarks/results/h200/s23_lookup_ab.json, then s23_lookup_ab2.json, run after shipping the
first: the lookup's config before the own-heuristic
rule against the rule's choice, both checked against the runner's reference and timed twice
with the CUDA-graph timer, best of each). The earlier config wins only when faster by more
than 2 %; else the rule's. Every timed bucket is pinned, so a new entry cannot become the
nearest entry of a neighbouring timed bucket whose measured winner differs.

    python benchmarks/s23_ship_lookup_ab.py
"""
from __future__ import annotations

import json
from pathlib import Path

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import Entry, Table, bucket_str, spaces
from autotune.cache import SHIPPED

RUNS = ("s23_lookup_ab.json", "s23_lookup_ab2.json")  # round 2: the neighbours of round 1's entries
ROOT = Path(__file__).resolve().parent / "results" / "h200"
DEVICE_VERSIONS = {"cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0"}   # the H200 image


def main() -> None:
    table = Table.load(SHIPPED / "nvidia-h200.json", "nvidia-h200")
    added = 0
    for run in RUNS:
        added += _ship(table, run)
    table.save()
    print(f"added {added} entries; the table holds {len(table.entries)}")


def _ship(table, run: str) -> int:
    data = json.loads((ROOT / run).read_text())
    added = 0
    for r in data["rows"]:
        if "old_us" not in r or not (r["old_ok"] and r["new_ok"]):
            continue
        old, new = min(r["old_us"], r["old2_us"]), min(r["new_us"], r["new2_us"])
        win, us, other = (r["old"], old, new) if old < 0.98 * new else (r["new"], new, old)
        what = "a nearby bucket's entry" if win is r["old"] else "this bucket's heuristic"
        ks = spaces()[r["kernel"]]
        bucket = bucket_str(ks.bucket(r["problem"]))
        if (r["kernel"], bucket) in table.entries:
            continue
        table.put(Entry(r["kernel"], bucket, dict(win), us=round(us, 3),
                        source_hash=ks.source_hash(), versions=dict(DEVICE_VERSIONS),
                        date=data["date"][:10],
                        evidence=f"benchmarks/results/h200/{run} ({what}, {us:.3f} us; the "
                                 f"other lookup choice {other:.3f} us in the same run)"))
        added += 1
        print(f"{r['kernel']} [{bucket}] {what} {win}: {us:.2f} vs {other:.2f} us")
    return added


if __name__ == "__main__":
    main()
