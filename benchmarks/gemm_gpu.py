"""GPU benchmarks of the gemm family, the cuBLAS baselines timed in the same run.

    python benchmarks/gemm_gpu.py --out DIR [--stages mm,gemv,fp8,quant,sweep]

Each stage writes DIR/gemm_<stage>.json (tskernels.bench rows: medians of CUDA-event timings
under CUDA-graph replay, input sets rotated beyond twice the L2, the copy roofline measured in
the same run) and prints a short table. Ours runs the Triton backends by name (they are what
the registry selects once run-verified). The cuBLAS blockwise fp8 baseline
(`torch._scaled_mm`) is probed per shape: where cuBLAS refuses a shape (M = 1) the row records
the error instead of a time. "sweep" times a few streaming-kernel configs on decode shapes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tskernels.bench import core
from tskernels.bench.cases import gemm as cases

TRITON = ("gemm.mm=triton,gemm.gemv=triton,gemm.fp8_block_mm=triton,"
          "gemm.quantize_fp8_per_token_group=triton,gemm.silu_and_mul_quantize_fp8=triton")


def _save(out: Path, name: str, obj) -> None:
    (out / f"gemm_{name}.json").write_text(json.dumps(obj, indent=1))


def _row_line(r: dict) -> str:
    s = r["shape"]
    o = r["ours"]
    base = [(k, v) for k, v in r.items() if isinstance(v, dict) and "us" in v and k != "ours"]
    parts = [f"{json.dumps(s, separators=(',', ':')):<34} ours {o['us']:9.2f} us"]
    if o.get("TFLOP/s"):
        parts.append(f"{o['TFLOP/s']:7.1f} TF")
    if o.get("GB/s"):
        parts.append(f"{o['GB/s'] / 1e3:5.2f} TB/s")
    for k, v in base:
        parts.append(f"| {k} {v['us']:9.2f} us x{v['speedup_of_ours']:.2f}")
    for k, v in r.items():
        if k.endswith("_error"):
            parts.append(f"| {k}: {v[:60]}")
    return " ".join(parts)


def run(name: str, shapes, roof: float, baselines=None) -> dict:
    res = core.run_bench(name, shapes, device="cuda", graph=True, roofline_gbps=roof,
                         backend=TRITON, baselines=baselines)
    for r in res["rows"]:
        print(_row_line(r), flush=True)
    return res


def fp8_stage(roof: float) -> dict:
    rows, meta = [], None
    for shape in cases.FP8_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        d = cases._fp8_make(shape, "cuda", gen)
        err = None
        try:
            cases.scaled_mm_blockwise(d)
            torch.cuda.synchronize()
        except RuntimeError as e:
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        del d
        res = run("gemm.fp8_block_mm", [shape], roof, baselines=[] if err else None)
        if err:
            res["rows"][0]["cublas_blockwise_error"] = err
            print(f"  cublas_blockwise: {err}", flush=True)
        rows += res["rows"]
        meta = res
    meta["rows"] = rows
    return meta


def sweep_stage() -> dict:
    """Streaming-kernel configs on decode shapes (bf16 M=1 and fp8 M=16), graph-replayed."""
    from tskernels.ops.gemm import triton_gemv as tg

    configs = [dict(BN=64, BK=128, num_stages=4, num_warps=4),
               dict(BN=64, BK=128, num_stages=3, num_warps=4),
               dict(BN=128, BK=128, num_stages=3, num_warps=4),
               dict(BN=64, BK=256, num_stages=3, num_warps=4)]
    out = []
    for fp8, m, n, k in [(False, 1, 28672, 4096), (False, 1, 4096, 4096),
                         (True, 16, 7168, 2048), (True, 16, 2112, 7168)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        mk = cases._fp8_make if fp8 else cases._mm_make
        sets = [mk({"M": m, "N": n, "K": k}, "cuda", gen) for _ in range(6)]
        for d in sets:
            d["o"] = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        for cfg in configs:
            if fp8 and cfg["BK"] != 128:
                continue

            def fn(d, cfg=cfg):
                o = d["o"]
                if fp8:
                    return tg.stream_mm(d["a"], d["b"], o, x_scale=d["sa"], w_scale=d["sb"],
                                        config=cfg)
                return tg.stream_mm(d["a"], d["b"], o, config=cfg)
            us = statistics.median(core.time_fn(fn, sets, "cuda", iters=200, graph=True))
            wbytes = n * k * (1 if fp8 else 2)
            rec = dict(fp8=fp8, M=m, N=n, K=k, config=cfg, us=round(us, 2),
                       TBps=round(wbytes / us / 1e6, 3),
                       split=tg.plan(m, n, k, fp8, torch.device("cuda"), cfg)[1])
            out.append(rec)
            print(json.dumps(rec), flush=True)
        del sets
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
            "rows": out}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", default="gemv,fp8,mm,quant,sweep")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    for stage in a.stages.split(","):
        t = time.time()
        print(f"== {stage}", flush=True)
        if stage == "mm":
            res = run("gemm.mm", None, roof)
        elif stage == "gemv":
            res = run("gemm.gemv", cases.GEMV_SHAPES + [{"M": 1, "N": 4096, "K": 14336,
                                                         "res": 1}], roof)
        elif stage == "fp8":
            res = fp8_stage(roof)
        elif stage == "quant":
            res = {"rows": []}
            for name in ("gemm.quantize_fp8_per_token_group", "gemm.silu_and_mul_quantize_fp8"):
                res[name] = run(name, None, roof)
        elif stage == "sweep":
            res = sweep_stage()
        else:
            raise SystemExit(f"unknown stage {stage!r}")
        res["command"] = "python " + " ".join(sys.argv)
        res["seconds"] = round(time.time() - t, 1)
        _save(out, stage, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
