"""Lab script: turn measured launch-config sweeps into the tables autotune ships (autotune/tables/).
(New tables come from `python -m autotune tune`; this converts the older sweep files.)

    python benchmarks/ship_tuned_tables.py   # reads the sweeps in SWEEPS

Each sweep row is one (shape, kernel form, config) timed on the H200 under CUDA-graph replay
(`python benchmarks/attention_gpu.py modes`); only rows of the forms plans launch now count
(page ids prefetched a tile ahead, "ptp"; fp8 caches: keys on the M side with q split into two
e4m3 terms, "q_fp8x2"; 16-bit caches: query heads on M, "base"), and the fastest per shape
becomes the shipped entry for that shape's problem key (the kernel's own key function, so
lookups at plan time hit exactly these buckets). Rows with and without "pdl" (the separate
merge as a programmatic dependent launch, which plans now always use on sm_90) both count:
it changed nothing measurable at B=16 (attention_decode_modes_b16_s4d.json).
"""
from __future__ import annotations

import json
from pathlib import Path

from autotune import Entry, Table, bucket_str, current_versions
from autotune.cache import SHIPPED
from tskernels.ops.attention.triton_decode import SPACE, TUNE_KERNEL, tune_problem

ROOT = Path(__file__).resolve().parent
SWEEPS = [ROOT / "results" / "h200" / name for name in (
    "attention_decode_modes_ptp_s4c.json",     # B=16/64/128 shapes
    "attention_decode_modes_b1_ptp_s4c.json",  # B=1
    "attention_decode_modes_b16_s4d.json",     # B=16, 2/4/8 splits
)]
# The sweep's problem: GQA 32 q / 8 kv heads, head_dim 128, page 16.
HQ, HKV, D = 32, 8, 128


def main() -> None:
    best: dict[str, dict] = {}
    for sweep in SWEEPS:
        if not sweep.exists():
            continue
        for row in json.loads(sweep.read_text()):
            s = row["shape"]
            form = set(row["mode"].split("+"))
            if "ptp" not in form or ("q_fp8x2" in form) != bool(s.get("fp8")) \
                    or not form <= {"base", "q_fp8x2", "ptp", "pdl"}:
                continue
            key = bucket_str(SPACE.bucket(tune_problem(D, "fp8" if s.get("fp8") else "bf16",
                                                       HQ // HKV, s["B"] * HKV, s["L"])))
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = dict(row, source=f"benchmarks/results/h200/{sweep.name}")
    path = SHIPPED / "nvidia-h200.json"
    table = Table.load(path, "nvidia-h200")
    for bucket, r in sorted(best.items()):
        table.put(Entry(TUNE_KERNEL, bucket, {"num_splits": r["splits"], "block_n": r["block_n"],
                                              "num_warps": r["warps"], "num_stages": r["stages"]},
                        us=round(r["us"], 1), source_hash=SPACE.source_hash(),
                        versions=dict(current_versions()), evidence=r["source"]))
    table.save()
    print(f"wrote {len(best)} entries for {TUNE_KERNEL} to {path}")

if __name__ == "__main__":
    main()
