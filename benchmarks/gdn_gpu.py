"""GDN on the H200: accuracy of ours and flash-linear-attention's kernels against float64, the
decode block-width sweep, and the tskernels-bench cases (ours vs the reference and FLA in the
same run). Each stage writes its JSON to OUT as soon as it ends.

    python benchmarks/gdn_gpu.py OUT_DIR STAGE ...
    stages: decode_ref accuracy conv prefill_ref (ours vs the reference, launch sweeps),
            decode_fla prefill_fla (ours vs FLA, FLA's accuracy, per-kernel profile)
One process per FLA stage keeps a failing baseline from taking the other stages with it. FLA
autotunes its prefill kernels on the first call (tens of configs): give prefill_fla >= 180 s.
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
from tskernels.bench.core import run_bench, time_fn
from tskernels.numerics import error_stats

OUT = Path(sys.argv[1])
STAGES = sys.argv[2:]
DATE = time.strftime("%Y-%m-%d")
DEV = "cuda"


def save(name: str, data) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1))
    print(f"-> {name}", flush=True)


def _prefill_acc_problem():
    gen = torch.Generator(device=DEV).manual_seed(0)
    d = cases._make_prefill({"T": 4096, "N": 4}, DEV, gen)
    f64 = {a: d[a].double() for a in ("q", "k", "v", "g", "beta")}
    want = ref.chunk_prefill(**f64, cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True)
    return d, want


def _decode_acc_problem():
    gen = torch.Generator(device=DEV).manual_seed(1)
    d = cases._make_decode({"B": 64}, DEV, gen)
    st64 = d["state"].double()
    want = ref.decode_step(*(d[a].double() for a in ("q", "k", "v", "g", "beta")), st64,
                           d["slots"], use_qk_l2norm=True)
    return d, want, st64


def accuracy(who: str) -> dict:
    """rel errors vs float64 (bf16 activations, Qwen3-Next shapes) of ours or FLA."""
    d, (want_o, want_s) = _prefill_acc_problem()
    if who == "ours":
        o, s = cases._ours_prefill(d)
    else:
        o, s = cases._fla_prefill(d)
        o = o[0]
    res = {"prefill_T4096_N4": {"o": str(error_stats(o, want_o)),
                                "state": str(error_stats(s, want_s))}}
    d, want, st64 = _decode_acc_problem()
    slots = d["slots"].long()
    if who == "ours":
        o = cases._ours_decode(d)
        res["decode_B64"] = {"o": str(error_stats(o, want)),
                             "state": str(error_stats(d["state"], st64))}
    else:  # FLA reads a dense state in batch order and returns the new one
        o, s = cases._fla_decode({**d, "state": d["state"][slots].contiguous()})
        res["decode_B64"] = {"o": str(error_stats(o[:, 0], want)),
                             "state": str(error_stats(s, st64[slots]))}
    return res


def sweep() -> dict:
    """Decode step time per value-block width (CUDA-graph replay), state bytes / time."""
    spec = next(k for k in tskernels.kernels("gdn", "decode_step") if k.backend == "triton")
    rows = []
    for b in SWEEP_B:
        gen = torch.Generator(device=DEV).manual_seed(0)
        n_sets = 2 if b >= 64 else 16
        sets = [cases._make_decode({"B": b}, DEV, gen) for _ in range(n_sets)]
        for bv in (16, 32, 64):
            fn = lambda d, bv=bv: spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"],  # noqa: E731
                                          d["state"], d["slots"], use_qk_l2norm=True, block_v=bv)
            us = statistics.median(time_fn(fn, sets, DEV, iters=200, graph=True))
            rows.append({"B": b, "block_v": bv, "us": round(us, 3),
                         "GB/s": round(cases._decode_bytes({"B": b}) / us / 1e3, 1)})
            print(rows[-1], flush=True)
        del sets
    return {"rows": rows}


SWEEP_B = (1, 64, 256)
SWEEP_SHAPES = ({"T": 16384, "N": 1}, {"T": 32768, "N": 8})
PREFILL_TUNING = [{}, {"state_bv": 16}, {"state_bv": 64}, {"wy_warps": 4}, {"out_warps": 4}]


def prefill_sweep() -> dict:
    """Our prefill's launch variants (eager, CUDA events) on two shapes."""
    spec = next(k for k in tskernels.kernels("gdn", "chunk_prefill") if k.backend == "triton")
    rows = []
    for shape in SWEEP_SHAPES:
        gen = torch.Generator(device=DEV).manual_seed(0)
        sets = [cases._make_prefill(shape, DEV, gen) for _ in range(2)]
        for tun in PREFILL_TUNING:
            fn = lambda d, tun=tun: spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"],  # noqa: E731
                                            cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True,
                                            tuning=tun)
            us = statistics.median(time_fn(fn, sets, DEV, iters=10))
            rows.append({"shape": shape, "tuning": tun, "us": round(us, 1),
                         "Mtok/s": round(shape["T"] / us, 2)})
            print(rows[-1], flush=True)
        del sets
    return {"rows": rows}


def profile() -> str:
    """Per-kernel GPU time of one T=65536 prefill, ours and FLA (torch profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    gen = torch.Generator(device=DEV).manual_seed(0)
    d = cases._make_prefill({"T": 65536, "N": 1}, DEV, gen)
    text = []
    for name, fn in (("ours", cases._ours_prefill), ("fla", cases._fla_prefill)):
        fn(d)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            fn(d)
            torch.cuda.synchronize()
        try:
            table = p.key_averages().table(sort_by="cuda_time_total", row_limit=12)
        except Exception:  # newer torch names it device time
            table = p.key_averages().table(sort_by="device_time_total", row_limit=12)
        text.append(f"== {name}, T=65536 N=1 ==\n{table}")
    return "\n".join(text)


def _prefill_bench(baseline: str) -> dict:
    r = run_bench("gdn.chunk_prefill", iters=10, baselines=[baseline])
    for row in r["rows"]:
        for k in ("ours", baseline):
            if k in row:
                row[k]["Mtok/s"] = round(row["shape"]["T"] / row[k]["us"], 2)
    return r


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"fla: {cases._fla() is not None}", flush=True)
    summary = []
    for stage in STAGES:
        t0 = time.time()
        try:
            if stage == "decode_ref":
                r = run_bench("gdn.decode_step", graph=True, iters=200, baselines=["reference"])
                r["block_v_sweep"] = sweep()
                save("gdn_decode_ref.json", r)
                summary += [("decode", row) for row in r["rows"]]
            elif stage == "decode_fla":
                r = run_bench("gdn.decode_step", graph=True, iters=200, baselines=["fla"])
                save("gdn_decode.json", r)
                summary += [("decode", row) for row in r["rows"]]
            elif stage == "accuracy":
                save("gdn_accuracy.json", {"date": DATE, "ours": accuracy("ours")})
            elif stage == "conv":
                r1 = run_bench("gdn.causal_conv1d_update", graph=True, iters=200)
                r2 = run_bench("gdn.causal_conv1d", iters=50)
                save("gdn_conv.json", {"update": r1, "prefill": r2})
                summary += [("conv_update", row) for row in r1["rows"]]
                summary += [("conv", row) for row in r2["rows"]]
            elif stage == "prefill_ref":
                r = _prefill_bench("reference")
                r["tuning_sweep"] = prefill_sweep()
                save("gdn_prefill_ref.json", r)
                summary += [("prefill", row) for row in r["rows"]]
            elif stage == "prefill_fla":
                r = _prefill_bench("fla")
                r["accuracy_fla"] = accuracy("fla")
                save("gdn_prefill.json", r)
                summary += [("prefill", row) for row in r["rows"]]
                (OUT / "gdn_profile.txt").write_text(profile())
        except Exception:
            traceback.print_exc()
        print(f"[{stage}] {time.time() - t0:.1f}s", flush=True)
    for kind, row in summary:
        cells = [f"{k} {row[k]['us']:.1f}us" + (f" {row[k]['Mtok/s']}Mtok/s" if "Mtok/s" in
                                                row[k] else "") for k in row
                 if isinstance(row.get(k), dict) and "us" in row[k]]
        extra = f" ({row['ours'].get('pct_of_copy_roofline')}% of copy)" if row.get("bytes") \
            else ""
        print(f"{kind:<12} {str(row['shape']):<22} " + " | ".join(cells) + extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
