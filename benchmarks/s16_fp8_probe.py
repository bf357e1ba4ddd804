"""Lab probe (H200): where the CUDA block-fp8 GEMM's time goes.

    PYTHONPATH=$PWD python benchmarks/s16_fp8_probe.py ablate OUT_DIR
    ncu ... python benchmarks/s16_fp8_probe.py ncu CONFIG      (CONFIG: a key of CONFIGS, or cublas)

ablate: the shipped tile configs beside builds with one part left out (the source's ABL_*
macros: no scale loads in the producer, one FMA instead of the promotion, no epilogue stores;
their results are wrong on purpose, so only their time is kept), graph-replayed over rotated
input sets at M = 4096 on two DeepSeek-V3 shapes; the differences place the time.
ncu: a few eager calls of one config for Nsight Compute to profile.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tskernels.bench import core
from tskernels.bench.cases import gemm as cases
from tskernels.ops.gemm import cuda_fp8_sm90 as cf

BASE = {"bn128": dict(block_n=128, stages=6, pipe=False),
        "bn256": dict(block_n=256, stages=4, pipe=False),
        "bn256cb1": dict(block_n=256, stages=4, pipe=False, cbuf=1),
        "bn128cb2": dict(block_n=128, stages=5, pipe=False, cbuf=2)}
# -D options a lab build may add (the ablation macros of commit f869496's source, since
# removed: ABL_NO_SCALES / ABL_NO_PROMOTE / ABL_NO_STORE; results in benchmarks/RESULTS.md)
ABLATIONS = {"": ()}
CONFIGS = {f"{b}{a}": dict(BASE[b], extra=x) for b in BASE for a, x in ABLATIONS.items()}


def _sets(m, n, k, count):
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [cases._fp8_make({"M": m, "N": n, "K": k}, "cuda", gen) for _ in range(count)]
    for d in sets:
        d["o"] = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    return sets


def ablate(out_dir: Path) -> None:
    rows = []
    for n, k in ((7168, 2048), (7168, 16384)):
        m = 4096
        sets = _sets(m, n, k, 6 if k == 2048 else 3)
        row = {"M": m, "N": n, "K": k}
        fl = 2 * m * n * k
        us = core.time_fn(cases.scaled_mm_blockwise, sets, "cuda", iters=60, graph=True)
        row["cublas_tflops"] = round(fl / sorted(us)[len(us) // 2] / 1e6, 1)
        for name, cfg in CONFIGS.items():
            fn = (lambda c: lambda d: cf.run(d["a"], d["sa"], d["b"], d["sb"], d["o"], c))(cfg)
            us = core.time_fn(fn, sets, "cuda", iters=60, graph=True)
            row[name] = round(fl / sorted(us)[len(us) // 2] / 1e6, 1)
        rows.append(row)
        print(json.dumps(row))
        del sets
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "s16_fp8_ablate.json").write_text(json.dumps(rows, indent=1))


def ncu(name: str) -> None:
    sets = _sets(4096, 7168, 2048, 1)
    d = sets[0]
    for _ in range(4):
        if name == "cublas":
            cases.scaled_mm_blockwise(d)
        else:
            cf.run(d["a"], d["sa"], d["b"], d["sb"], d["o"], CONFIGS[name])
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "ablate":
        ablate(Path(sys.argv[2]))
    else:
        ncu(sys.argv[2])
