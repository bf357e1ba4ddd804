"""Lab script (H200): the CUDA block-fp8 GEMM (gemm.fp8_block_mm.cuda_sm90) against cuBLAS
blockwise (torch._scaled_mm, 1x128 / 128x128 scales) and the Triton persistent kernel, in one
process, on the DeepSeek-V3 shapes of issue 24.

    PYTHONPATH=$PWD python benchmarks/s16_fp8_gpu.py OUT_DIR [BUDGET_S] [M,M,...]

Every variant's output is first compared with cuBLAS's on the same inputs (bf16 bound), then
timed: CUDA-graph replays of back-to-back calls over input sets rotated beyond 2x the L2,
medians (tskernels.bench.core.time_fn). Writes OUT_DIR/s16_fp8.json, prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from tskernels.bench import core
from tskernels.bench.cases import gemm as cases
from tskernels.ops.gemm import cuda_fp8_sm90 as cf, triton_mm as tm

ROTATE_BYTES = 150 << 20
CUDA_CONFIGS = {
    "shipped": {},  # cuda_fp8_sm90.CONFIG
    "bn256_s4_cb1_g16": dict(block_n=256, stages=4, pipe=False, cbuf=1, group_m=16),
}
# a run may name its own: FP8_CONFIGS='{"name": {config}, ...}' (JSON; "shipped" is added
# first), FP8_OUT the JSON's file name (default s16_fp8.json)
if os.environ.get("FP8_CONFIGS"):
    CUDA_CONFIGS = {"shipped": {}, **json.loads(os.environ["FP8_CONFIGS"])}
OUT_NAME = os.environ.get("FP8_OUT", "s16_fp8.json")


def _pairs(cfg) -> int:
    from tskernels.ops import cuda_driver
    c = cf.check_config(cfg)
    smem = cf.smem_bytes(c["block_n"], c["stages"], c["cbuf"])
    fn = cuda_driver.sm90a_function(torch.device("cuda", 0), cf.SOURCE, cf.KERNEL, cf.nvcc_options(
        c["block_n"], c["stages"], c["pipe"], torch.bfloat16, c["cluster"], c["cbuf"]), smem,
        "fp8")
    return cf.resident_clusters(fn, smem, torch.device("cuda", 0), c["cluster"])


def main() -> None:
    out_dir = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
    ms = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [4096, 1024, 256]
    t_end = time.time() + budget
    out_dir.mkdir(parents=True, exist_ok=True)
    roof = core.copy_bandwidth("cuda")
    print("resident CTA pairs:", {name: _pairs(cfg) for name, cfg in CUDA_CONFIGS.items()
                                  if cfg.get("cluster", 1) == 2}, "shipped:", cf.CONFIG)
    rows = []
    shapes = [(m, n, k) for m in ms for n, k in cases.DSV3]
    if 4096 in ms:
        shapes.append((8192, 8192, 8192))
    for m, n, k in shapes:
        if time.time() > t_end:
            print(f"budget spent before {m}x{n}x{k}")
            break
        shape = {"M": m, "N": n, "K": k}
        per_set = m * k + n * k + m * n * 2
        gen = torch.Generator(device="cuda").manual_seed(0)
        sets = [cases._fp8_make(shape, "cuda", gen)
                for _ in range(max(2, -(-ROTATE_BYTES // per_set) + 1))]
        for d in sets:
            d["o"] = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        flops = 2 * m * n * k
        row = {"M": m, "N": n, "K": k, "sets": len(sets)}
        ref_out = cases.scaled_mm_blockwise(sets[0]).float()
        variants = {"cublas_blockwise": cases.scaled_mm_blockwise,
                    "triton": lambda d: tm.persistent_mm(d["a"], d["b"], d["o"],
                                                         a_scale=d["sa"], b_scale=d["sb"])}
        for name, cfg in CUDA_CONFIGS.items():
            variants[name] = (lambda c: lambda d: cf.run(d["a"], d["sa"], d["b"], d["sb"],
                                                         d["o"], c))(cfg)
        for name, fn in variants.items():
            try:
                sets[0]["o"].fill_(float("nan"))
                got = fn(sets[0]).float()
                err = ((got - ref_out).norm() / ref_out.norm()).item()
                row[f"{name}_relerr"] = err
                if not err < 2e-2:  # NaN fails too
                    row[f"{name}_us"] = None
                    print(f"{m}x{n}x{k} {name}: WRONG rel err {err}")
                    continue
                us = core.time_fn(fn, sets, "cuda", iters=100, graph=True)
                med = sorted(us)[len(us) // 2]
                row[f"{name}_us"] = round(med, 2)
                row[f"{name}_tflops"] = round(flops / med / 1e6, 1)
            except Exception as e:  # a failing variant is recorded, the others still run
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{m}x{n}x{k} {name}: {row[f'{name}_error']}")
        rows.append(row)
        del sets
        (out_dir / OUT_NAME).write_text(json.dumps(
            {"copy_roofline_gbps": round(roof, 1), "rows": rows}, indent=1))
    names = ["cublas_blockwise", "triton", *CUDA_CONFIGS]
    print(f"copy roofline {roof:.0f} GB/s; TFLOP/s (ratio to cuBLAS blockwise)")
    print("M,N,K".ljust(20) + "".join(n[:18].rjust(19) for n in names))
    for r in rows:
        cb = r.get("cublas_blockwise_tflops")
        cells = []
        for nme in names:
            t = r.get(f"{nme}_tflops")
            cells.append(("-" if t is None else f"{t:.0f}" + (f" ({t / cb:.2f})" if cb else ""))
                         .rjust(19))
        print(f"{r['M']},{r['N']},{r['K']}".ljust(20) + "".join(cells))


if __name__ == "__main__":
    main()
