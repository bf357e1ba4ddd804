"""Lab script: ship the H200 tuning runs of `benchmarks/autotune_gpu.py` into the package's table
(autotune/tables/nvidia-h200.json).

    python benchmarks/ship_autotune_run.py

Sources (benchmarks/results/h200/): the tune rows (`autotune_tune_graph*.json`: every kernel's
bench buckets, the pick after heuristic-vs-candidates timing under CUDA-graph replay) and the
start-up window's user table of the dummy Llama-3-8B's decode buckets
(`autotune_user_engine.json`). A bucket the table already holds keeps its entry (the attention
decode sweeps and the MLA entry were measured over more configs); a pick equal to the heuristic
is shipped too: the lookup then says `exact`, with the run as evidence. Each entry is stamped
with the versions of the device run (triton / torch / CUDA of the H200 image) and the kernel's
source hash of this tree, after checking that hash against the one the run itself recorded
where it recorded one (the window's table).
"""
from __future__ import annotations

import json
from pathlib import Path

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import Entry, Table, spaces
from autotune.cache import SHIPPED

ROOT = Path(__file__).resolve().parent / "results" / "h200"
RUNS = ("autotune_tune_graph.json", "autotune_tune_graph_gemm.json")
WINDOW = "autotune_user_engine.json"
DEVICE_VERSIONS = {"cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0"}   # the H200 image


def main() -> None:
    table = Table.load(SHIPPED / "nvidia-h200.json", "nvidia-h200")
    have = set(table.entries)
    added = 0
    window = json.loads((ROOT / WINDOW).read_text())["entries"]
    for e in window:
        ks = spaces()[e["kernel"]]
        if e["source_hash"] != ks.source_hash():
            raise SystemExit(f"{e['kernel']}: the run's source hash {e['source_hash']} is not "
                             f"this tree's {ks.source_hash()}: re-tune instead of shipping")
        if e.get("evidence", "").endswith("(partial)") or (e["kernel"], e["bucket"]) in have:
            continue
        table.put(Entry.from_json(dict(e, evidence=f"benchmarks/results/h200/{WINDOW} "
                                                  "(start-up window, graph timer)")))
        have.add((e["kernel"], e["bucket"]))
        added += 1
    for run in RUNS:
        data = json.loads((ROOT / run).read_text())
        for r in data["rows"]:
            if "error" in r or r.get("partial") or (r["kernel"], r["bucket"]) in have:
                continue
            ks = spaces()[r["kernel"]]
            table.put(Entry(r["kernel"], r["bucket"], dict(r["pick"]), us=r["us"],
                            source_hash=ks.source_hash(), versions=dict(DEVICE_VERSIONS),
                            ties=list(r.get("ties") or []), date=data["date"],
                            evidence=f"benchmarks/results/h200/{run} (heuristic "
                                     f"{r['heuristic_us']} us in the same run; --repeat "
                                     f"changed {len(r['repeat']['changed'])})"))
            have.add((r["kernel"], r["bucket"]))
            added += 1
    table.save()
    print(f"added {added} entries; the table holds {len(table.entries)}")


if __name__ == "__main__":
    main()
