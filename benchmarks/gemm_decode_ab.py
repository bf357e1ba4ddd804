"""Old vs new side by side for the decode-shaped GEMMs of issue 24, in one GPU run.

    python benchmarks/gemm_decode_ab.py --out DIR [--stages moe,gemv,fp8]

moe: the fused-MoE layer (Qwen3-30B-A3B shape) at T = 1..16: ours vs the aligned path it
  replaced at decode sizes and vLLM's Triton fused-MoE (tskernels.bench.cases.moe).

gemv: the Llama-3-8B decode projections at M = 1 / 16: our streaming kernel with and without
  programmatic dependent launch (PDL), cuBLAS (torch.mm), and a split sweep (programs per SM
  x tile config) per M = 1 shape. Calls are graph-replayed back to back, so with PDL each call's
  launch overlaps the previous call's tail (in a model the previous kernel is a norm / RoPE).
fp8: fp8_block_mm on the DeepSeek-V3 shapes at M = 1 / 16 / 64 (streaming kernel, and the
  persistent kernel with 64-row tiles at M = 64) and M = 4096 (the shipped persistent config
  vs two one-warpgroup CTAs per SM), cuBLAS blockwise (torch._scaled_mm) beside them.
Each stage writes DIR/i24_<stage>.json; medians of CUDA-event-timed graph replays, input sets
rotated beyond twice the L2, the copy roofline measured in the same run.
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
from tskernels.ops.gemm import triton_gemv as tg
from tskernels.ops.gemm import triton_mm as tm

ROTATE_BYTES = 200 << 20  # > 2 x the H200's 50 MB L2
# (config, programs per SM) beside the shipped (BN=64, BK=128, 4 stages; 4 per SM), at M = 1
SWEEP = [(dict(BN=64, BK=128, num_stages=4, num_warps=4), 2),
         (dict(BN=64, BK=128, num_stages=4, num_warps=4), 8),
         (dict(BN=64, BK=256, num_stages=3, num_warps=4), 4)]
MOE_TRITON = "moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton"
FP8_4096_CONFIGS = {
    "shipped": None,
    "bm64_2cta_s3": dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=3, num_warps=4,
                         CTAS_PER_SM=2),
    "bm64_2cta_s4": dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=4, num_warps=4,
                         CTAS_PER_SM=2),
}
FP8_M64_PERSISTENT = dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=4, num_warps=4)


def _sets(make, shape, wbytes):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = max(2, -(-ROTATE_BYTES // wbytes) + 1)
    sets = [make(shape, "cuda", gen) for _ in range(n)]
    for d in sets:
        d["o"] = torch.empty(shape["M"], shape["N"], dtype=torch.bfloat16, device="cuda")
    return sets


def _time(fn, sets, iters=200) -> float:
    return round(statistics.median(core.time_fn(fn, sets, "cuda", iters=iters, graph=True)), 2)


def _with_pdl(flag: bool, fn):
    def run(d):
        keep = tg.USE_PDL
        tg.USE_PDL = flag
        try:
            return fn(d)
        finally:
            tg.USE_PDL = keep
    return run


def _with_target(per_sm: int, fn):
    def run(d):
        keep = tg.TARGET_PROGRAMS_PER_SM
        tg.TARGET_PROGRAMS_PER_SM = per_sm
        try:
            return fn(d)
        finally:
            tg.TARGET_PROGRAMS_PER_SM = keep
    return run


def gemv_stage(roof: float) -> dict:
    rows = []
    for shape in cases.GEMV_SHAPES:
        m, n, k = shape["M"], shape["N"], shape["K"]
        wbytes = n * k * 2
        sets = _sets(cases._mm_make, shape, wbytes)

        def ours(d, cfg=None):
            return tg.stream_mm(d["a"], d["b"], d["o"], config=cfg)

        r = {"shape": shape, "weight_MB": round(wbytes / 1e6, 1),
             "floor_us": round(wbytes / roof / 1e3, 2),
             "pdl_off_us": _time(_with_pdl(False, ours), sets),
             "pdl_on_us": _time(_with_pdl(True, ours), sets),
             "cublas_us": _time(lambda d: torch.mm(d["a"], d["b"].t(), out=d["o"]), sets),
             "sweep": []}
        shipped = dict(config=tg.STREAM_CONFIGS[("16bit", 16)], programs_per_sm=4,
                       split=tg.plan(m, n, k, False, torch.device("cuda"))[1],
                       us=r["pdl_on_us"])
        for cfg, per_sm in (SWEEP if m == 1 else []):
            fn = _with_target(per_sm, _with_pdl(True, lambda d, c=cfg: ours(d, c)))
            split = _with_target(per_sm, lambda _: tg.plan(m, n, k, False,
                                                           torch.device("cuda"), cfg)[1])(None)
            r["sweep"].append(dict(config=cfg, programs_per_sm=per_sm, split=split,
                                   us=_time(fn, sets, iters=100)))
        best = min([shipped] + r["sweep"], key=lambda x: x["us"])
        r["best_sweep"] = best
        for key in ("pdl_off_us", "pdl_on_us", "cublas_us"):
            r[key.replace("_us", "_TBps")] = round(wbytes / r[key] / 1e6, 3)
        rows.append(r)
        print(f"gemv M={m:<2} N={n:<5} K={k:<5} floor {r['floor_us']:6.2f} | pdl off "
              f"{r['pdl_off_us']:6.2f} on {r['pdl_on_us']:6.2f} | cuBLAS {r['cublas_us']:6.2f}"
              f" | best sweep {best['us']:6.2f} ({best['config']['BN']}x{best['config']['BK']}"
              f" s{best['config']['num_stages']} {best['programs_per_sm']}/SM "
              f"split {best['split']})", flush=True)
        del sets
    return {"rows": rows}


def fp8_stage(roof: float) -> dict:
    rows = []
    for shape in cases.FP8_SHAPES:
        m, n, k = shape["M"], shape["N"], shape["K"]
        wbytes = n * k
        sets = _sets(cases._fp8_make, shape, wbytes + m * k)
        r = {"shape": shape, "weight_MB": round(wbytes / 1e6, 1)}

        def stream(d):
            return tg.stream_mm(d["a"], d["b"], d["o"], x_scale=d["sa"], w_scale=d["sb"])

        def persistent(d, cfg=None):
            return tm.persistent_mm(d["a"], d["b"], d["o"], a_scale=d["sa"], b_scale=d["sb"],
                                    config=cfg)
        try:
            cases.scaled_mm_blockwise(sets[0])
            torch.cuda.synchronize()
            r["cublas_us"] = _time(cases.scaled_mm_blockwise, sets)
        except RuntimeError as e:
            r["cublas_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        if m <= tg.MAX_M:
            r["floor_us"] = round(wbytes / roof / 1e3, 2)
            r["stream_pdl_off_us"] = _time(_with_pdl(False, stream), sets)
            r["stream_us"] = _time(_with_pdl(True, stream), sets)
            if m == 64:
                r["persistent_bm64_us"] = _time(lambda d: persistent(d, FP8_M64_PERSISTENT),
                                                sets)
            for key in [x for x in r if x.endswith("_us") and x != "floor_us"]:
                r[key.replace("_us", "_TBps")] = round(wbytes / r[key] / 1e6, 3)
        else:
            flops = 2 * m * n * k
            for name, cfg in FP8_4096_CONFIGS.items():
                r[f"{name}_us"] = _time(lambda d, c=cfg: persistent(d, c), sets, iters=30)
            for key in [x for x in r if x.endswith("_us")]:
                r[key.replace("_us", "_TFLOPs")] = round(flops / r[key] / 1e6, 1)
        rows.append(r)
        print("fp8 " + json.dumps({k: v for k, v in r.items() if not k.endswith("_us")
                                   or k == "cublas_us"}), flush=True)
        del sets
    return {"rows": rows}


def moe_stage(roof: float) -> dict:
    """The whole MoE layer (routing from logits to the combined output) at decode sizes: ours
    (the registry's Triton kernels: the align-free path up to triton_direct.MAX_TOKENS) vs
    the aligned path it replaced and vLLM's Triton fused-MoE (when its copy is present)."""
    from tskernels.bench.cases import moe as mcases

    shapes = [{"T": t, **mcases.QWEN3} for t in (1, 2, 4, 8, 16)]
    names = [b for b in ("aligned_path", "direct_token_down", "vllm_triton", "vllm_gemms")
             if b in core.benches()["moe.fused_layer"].baselines]
    res = core.run_bench("moe.fused_layer", shapes, graph=True, baselines=names,
                         backend=MOE_TRITON)
    for r in res["rows"]:
        parts = [f"moe T={r['shape']['T']:<3} ours {r['ours']['us']:7.1f} us"]
        parts += [f"{k} {v['us']:7.1f}" for k, v in r.items()
                  if isinstance(v, dict) and "us" in v and k != "ours"]
        print(" | ".join(parts), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", default="moe,gemv,fp8")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    for stage in a.stages.split(","):
        t = time.time()
        res = {"gemv": gemv_stage, "fp8": fp8_stage, "moe": moe_stage}[stage](roof)
        res.update(command="python " + " ".join(sys.argv), date=time.strftime("%Y-%m-%d %H:%M"),
                   device=torch.cuda.get_device_name(), torch=torch.__version__,
                   copy_roofline_GBps=round(roof, 1), seconds=round(time.time() - t, 1))
        (out / f"i24_{stage}.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
