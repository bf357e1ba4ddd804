"""GDN on the H200: accuracy of ours and flash-linear-attention's kernels against float64, the
decode block-width sweep, and the tskernels-bench cases (ours vs the reference and FLA in the
same run). Each stage writes its JSON to OUT as soon as it ends.

    python benchmarks/gdn_gpu.py OUT_DIR [stage ...]     (stages: accuracy sweep decode conv prefill)
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

import tskernels
import tskernels_ref.gdn as ref
from tskernels.bench.cases import gdn as cases
from tskernels.bench.core import copy_bandwidth, run_bench, time_fn
from tskernels.numerics import error_stats

OUT = Path(sys.argv[1])
STAGES = sys.argv[2:] or ["accuracy", "sweep", "decode", "conv", "prefill"]
DATE = time.strftime("%Y-%m-%d")


def save(name: str, data) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1))
    print(f"-> {name}", flush=True)


def accuracy() -> dict:
    """rel errors vs float64 of ours (bf16 activations) and FLA on the Qwen3-Next shapes."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    d = cases._make_prefill({"T": 4096, "N": 4}, "cuda", gen)
    f64 = {a: d[a].double() for a in ("q", "k", "v", "g", "beta")}
    want_o, want_s = ref.chunk_prefill(**f64, cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True)
    o, s = cases._ours_prefill(d)
    res["prefill_T4096_N4"] = {"ours_o": str(error_stats(o, want_o)),
                               "ours_state": str(error_stats(s, want_s))}
    if cases._fla() is not None:
        fo, fs = cases._fla_prefill(d)
        res["prefill_T4096_N4"].update(fla_o=str(error_stats(fo[0], want_o)),
                                       fla_state=str(error_stats(fs, want_s)))
    d = cases._make_decode({"B": 64}, "cuda", gen)
    st64 = d["state"].double()
    want = ref.decode_step(*(d[a].double() for a in ("q", "k", "v", "g", "beta")), st64,
                           d["slots"], use_qk_l2norm=True)
    dense = d["state"].clone()
    o = cases._ours_decode(d)
    res["decode_B64"] = {"ours_o": str(error_stats(o, want)),
                         "ours_state": str(error_stats(d["state"], st64))}
    if cases._fla() is not None:
        d["state"] = dense[d["slots"].long()]  # FLA reads a dense state in batch order
        fo, fs = cases._fla_decode(d)
        res["decode_B64"].update(fla_o=str(error_stats(fo[:, 0], want)),
                                 fla_state=str(error_stats(fs, st64[d["slots"].long()])))
    return res


def sweep() -> dict:
    """Decode step time per value-block width (CUDA-graph replay), state bytes / time."""
    spec = next(k for k in tskernels.kernels("gdn", "decode_step") if k.backend == "triton")
    rows = []
    for b in (1, 64, 256):
        gen = torch.Generator(device="cuda").manual_seed(0)
        n_sets = 2 if b >= 64 else 16
        sets = [cases._make_decode({"B": b}, "cuda", gen) for _ in range(n_sets)]
        for bv in (16, 32, 64):
            fn = lambda d, bv=bv: spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"],  # noqa: E731
                                          d["state"], d["slots"], use_qk_l2norm=True, block_v=bv)
            us = statistics.median(time_fn(fn, sets, "cuda", iters=200, graph=True))
            rows.append({"B": b, "block_v": bv, "us": round(us, 3),
                         "GB/s": round(cases._decode_bytes({"B": b}) / us / 1e3, 1)})
            print(rows[-1], flush=True)
    return {"rows": rows}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    roof = copy_bandwidth("cuda")
    print(f"copy roofline {roof:.0f} GB/s; fla: {cases._fla() is not None}", flush=True)
    summary = []
    for stage in STAGES:
        t0 = time.time()
        try:
            if stage == "accuracy":
                save("gdn_accuracy.json", {"date": DATE, **accuracy()})
            elif stage == "sweep":
                save("gdn_decode_sweep.json", {"date": DATE, "copy_roofline_GBps": roof,
                                               **sweep()})
            elif stage == "decode":
                r = run_bench("gdn.decode_step", graph=True, iters=200, roofline_gbps=roof)
                save("gdn_decode.json", r)
                summary += [("decode", row["shape"], row) for row in r["rows"]]
            elif stage == "conv":
                r1 = run_bench("gdn.causal_conv1d_update", graph=True, iters=200,
                               roofline_gbps=roof)
                r2 = run_bench("gdn.causal_conv1d", iters=50, roofline_gbps=roof)
                save("gdn_conv.json", {"update": r1, "prefill": r2})
                summary += [("conv_update", row["shape"], row) for row in r1["rows"]]
                summary += [("conv", row["shape"], row) for row in r2["rows"]]
            elif stage == "prefill":
                r = run_bench("gdn.chunk_prefill", iters=20, roofline_gbps=roof)
                for row in r["rows"]:
                    for k in ("ours", "fla", "reference"):
                        if k in row:
                            row[k]["Mtok/s"] = round(row["shape"]["T"] / row[k]["us"], 2)
                save("gdn_prefill.json", r)
                summary += [("prefill", row["shape"], row) for row in r["rows"]]
        except Exception:
            traceback.print_exc()
        print(f"[{stage}] {time.time() - t0:.1f}s", flush=True)
    for kind, shape, row in summary:
        cells = [f"{k} {row[k]['us']:.1f}us" + (f" {row[k]['Mtok/s']}Mtok/s" if 'Mtok/s' in
                                                row[k] else "") for k in row
                 if isinstance(row.get(k), dict) and "us" in row[k]]
        extra = f" {row['ours'].get('pct_of_copy_roofline')}%roof" if row.get("bytes") else ""
        print(f"{kind:<12} {str(shape):<22} " + " | ".join(cells) + extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
