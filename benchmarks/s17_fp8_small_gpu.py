"""Lab script (session 17, H200): block-fp8 GEMM at decode sizes (M = 1 / 16 / 64), issue 24's
>= 3.3 TB/s target, with the fp8 streaming kernel launched as a programmatic dependent that asks
L2 for its first weight tiles before it waits (triton_gemv.FP8_PREFETCH_TILES), beside the plain
launch that ships, a programs-per-SM sweep, the CUDA wgmma kernel at M = 64 and cuBLAS blockwise.

    python benchmarks/s17_fp8_small_gpu.py OUT_DIR BUDGET_S

Every variant's output is compared with the float64 product of the dequantized operands first
(a variant that fails is reported and not timed). Timing: tskernels.bench.core.time_fn with
graph=True (calls back to back in one CUDA graph, input sets rotated past 200 MB), medians; the
copy roofline measured in the same run. Writes OUT_DIR/s17_fp8_small.json.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tskernels.bench import core
from tskernels.bench.cases import gemm as cases
from tskernels.ops.gemm import cuda_fp8_sm90 as cf
from tskernels.ops.gemm import triton_gemv as tg
from tskernels_ref import gemm as ref

ROTATE_BYTES = 200 << 20
SHAPES = [(7168, 2048), (2112, 7168), (24576, 1536), (7168, 16384)]


def _sets(shape, wbytes):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = max(2, -(-ROTATE_BYTES // wbytes) + 1)
    sets = [cases._fp8_make(shape, "cuda", gen) for _ in range(n)]
    for d in sets:
        d["o"] = torch.full((shape["M"], shape["N"]), float("nan"), dtype=torch.bfloat16,
                            device="cuda")
    return sets


def _knobs(fn, **kv):
    def run(d):
        keep = {k: getattr(tg, k) for k in kv}
        for k, v in kv.items():
            setattr(tg, k, v)
        try:
            return fn(d)
        finally:
            for k, v in keep.items():
                setattr(tg, k, v)
    return run


def _stream(d):
    return tg.stream_mm(d["a"], d["b"], d["o"], x_scale=d["sa"], w_scale=d["sb"])


def _cuda(bn):
    cfg = dict(cf.CONFIG, block_n=bn)
    return lambda d: cf.run(d["a"], d["sa"], d["b"], d["sb"], d["o"], cfg)


def _check(fn, d) -> float:
    d["o"].fill_(float("nan"))
    fn(d)
    torch.cuda.synchronize()
    want = ref.fp8_block_mm(d["a"], d["sa"], d["b"], d["sb"], out_dtype=torch.float32).double()
    got = d["o"].double()
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    return err if torch.isfinite(got).all() else float("inf")


def main() -> int:
    out, budget = Path(sys.argv[1]), float(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    variants = {
        "plain": _knobs(_stream, FP8_PREFETCH_TILES=0),
        "pdl_pre1": _knobs(_stream, FP8_PREFETCH_TILES=1),
        "pdl_pre2": _knobs(_stream, FP8_PREFETCH_TILES=2),
        "pdl_pre4": _knobs(_stream, FP8_PREFETCH_TILES=4),
        "pdl_pre2_2sm": _knobs(_stream, FP8_PREFETCH_TILES=2, TARGET_PROGRAMS_PER_SM=2),
        "pdl_pre2_8sm": _knobs(_stream, FP8_PREFETCH_TILES=2, TARGET_PROGRAMS_PER_SM=8),
        "plain_8sm": _knobs(_stream, FP8_PREFETCH_TILES=0, TARGET_PROGRAMS_PER_SM=8),
    }
    rows = []
    for m in (1, 16, 64):
        for n, k in SHAPES:
            if time.time() - t0 > budget - 20:
                print("budget spent", flush=True)
                break
            shape = {"M": m, "N": n, "K": k}
            wbytes = n * k
            sets = _sets(shape, wbytes + m * k)
            r = {"M": m, "N": n, "K": k, "weight_MB": round(wbytes / 1e6, 1),
                 "floor_us": round(wbytes / roof / 1e3, 2), "err": {}, "us": {}}
            vs = dict(variants)
            if m == 64:
                vs["cuda_bn128"], vs["cuda_bn256"] = _cuda(128), _cuda(256)
            if m > 1:
                vs["cublas"] = cases.scaled_mm_blockwise
            for name, fn in vs.items():
                try:
                    if name != "cublas":
                        e = r["err"][name] = round(_check(fn, sets[0]), 6)
                        if not e < 2e-2:
                            print(f"  {name}: error {e} -- not timed", flush=True)
                            continue
                    r["us"][name] = round(statistics.median(
                        core.time_fn(fn, sets, "cuda", iters=200, graph=True)), 2)
                except Exception as ex:  # recorded, the others go on
                    r["err"][name] = f"{type(ex).__name__}: {str(ex)[:200]}"
            r["TBps"] = {kk: round(wbytes / v / 1e6, 3) for kk, v in r["us"].items()}
            rows.append(r)
            best = max(r["TBps"].items(), key=lambda x: x[1]) if r["TBps"] else None
            print(f"M={m:<2} N={n:<5} K={k:<5} floor {r['floor_us']:6.2f} | " +
                  " ".join(f"{kk} {v:.2f}" for kk, v in r["TBps"].items()) +
                  f" | best {best}", flush=True)
            del sets
            torch.cuda.empty_cache()
    res = dict(rows=rows, command="python " + " ".join(sys.argv),
               date=time.strftime("%Y-%m-%d %H:%M"), device=torch.cuda.get_device_name(),
               torch=torch.__version__, copy_roofline_GBps=round(roof, 1),
               seconds=round(time.time() - t0, 1))
    (out / "s17_fp8_small.json").write_text(json.dumps(res, indent=1))
    print("\nTB/s of fp8 weights (target >= 3.3):")
    names = sorted({kk for r in rows for kk in r["TBps"]})
    print(f"{'M,N,K':<18}" + "".join(f"{x[:12]:>13}" for x in names))
    for r in rows:
        print(f"{r['M']},{r['N']},{r['K']:<10}"[:18].ljust(18) +
              "".join(f"{r['TBps'].get(x, float('nan')):>13.2f}" for x in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
