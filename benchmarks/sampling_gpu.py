"""Sampling on the H200: the tskernels-bench cases (ours = the Triton kernels, the torch
baselines in the same run, CUDA-graph replay) and the sampler's cost per parameter mix.

    PYTHONPATH=. python benchmarks/sampling_gpu.py OUT_DIR [stage ...]  (stages: bench paths bins)
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
from tskernels.bench.cases import sampling as cases
from tskernels.bench.core import copy_bandwidth, run_bench, time_fn

OUT = Path(sys.argv[1])
STAGES = sys.argv[2:] or ["bench", "paths", "bins"]


def save(name: str, data) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1))
    print(f"-> {name}", flush=True)


def bench() -> dict:
    roof = copy_bandwidth("cuda")
    res = {}
    for op in ("sampling.greedy", "sampling.sample", "sampling.apply_penalties"):
        res[op] = run_bench(op, graph=True, backend="triton", roofline_gbps=roof, iters=50)
        for row in res[op]["rows"]:
            print(op, row["shape"], {k: v["us"] for k, v in row.items()
                                     if isinstance(v, dict) and "us" in v}, flush=True)
    return res


def paths() -> dict:
    """B=64, V=151936: ours for each parameter mix (which rows take the candidate path and
    which the bisection fallback), CUDA-graph replay."""
    mixes = {"k50_p0.9_minp0.05": {}, "k50": dict(p=1.0, minp=0.0),
             "p0.9": dict(k=0, minp=0.0), "p0.9_minp0.05": dict(k=0),
             "minp0.1": dict(k=0, p=1.0, minp=0.1), "temperature_only": dict(k=0, p=1.0, minp=0.0),
             "greedy": dict(T=0.0, k=0, p=1.0, minp=0.0), "k1000_p0.95": dict(k=1000, p=0.95)}
    rows = []
    for b in (64,):
        for name, kw in mixes.items():
            gen = torch.Generator(device="cuda").manual_seed(0)
            shape = {"B": b, "V": cases.V, **kw}
            sets = [cases._make(shape, "cuda", gen) for _ in range(3)]
            fn = lambda d: tskernels.sampling.sample(d["logits"], **cases._params(d),  # noqa: E731
                                                     backend="triton")
            us = statistics.median(time_fn(fn, sets, "cuda", iters=40, graph=True))
            rows.append({"B": b, "mix": name, "us": round(us, 2)})
            print(rows[-1], flush=True)
    return {"rows": rows, "note": "logits randn*3, T=0.8 unless the mix says otherwise"}


def bins() -> dict:
    """Histogram resolution sweep of the sampler (not the run-verified default unless it is
    (256, 8.0)): time per call and whether every token equals the default launch's."""
    from tskernels.ops.sampling import triton_sample as ts
    rows = []
    for b in (64, 256):
        for name, kw in {"k50_p0.9_minp0.05": {}, "p0.9": dict(k=0, minp=0.0)}.items():
            gen = torch.Generator(device="cuda").manual_seed(0)
            sets = [cases._make({"B": b, "V": cases.V, **kw}, "cuda", gen) for _ in range(2)]
            want = ts.run(sets[0]["logits"], **cases._params(sets[0])).token_ids
            # (bins, bins per unit, candidate buffer): benchmarks/sampling_plan_sim.py says
            # why finer bins and a larger buffer are what top-p alone needs
            for nb, unit, cmax in ((256, 8.0, 2048), (256, 16.0, 2048), (256, 16.0, 8192),
                                   (512, 32.0, 4096), (64, 4.0, 2048)):
                fn = lambda d, nb=nb, unit=unit, cmax=cmax: ts.run(  # noqa: E731
                    d["logits"], **cases._params(d), bins=(nb, unit), cmax=cmax)
                same = bool(torch.equal(fn(sets[0]).token_ids, want))
                us = statistics.median(time_fn(fn, sets, "cuda", iters=40, graph=True))
                rows.append({"B": b, "mix": name, "bins": [nb, unit], "cmax": cmax,
                             "us": round(us, 2), "same_tokens": same})
                print(rows[-1], flush=True)
    return {"rows": rows}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    date = time.strftime("%Y-%m-%d %H:%M:%S")
    ok = True
    for stage in STAGES:
        try:
            data = {"bench": bench, "paths": paths, "bins": bins}[stage]()
            data = {"date": date, "device": torch.cuda.get_device_name(), "stage": stage,
                    "command": " ".join(sys.argv), "data": data}
            save(f"sampling_{stage}.json", data)
        except Exception:
            ok = False
            traceback.print_exc()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
