"""Lab script (issue 24's MoE T = 1 target, <= 21 µs; 26.7 measured): the decode MoE's
align-free path (tskernels/ops/moe/triton_direct.py) under other tile shapes. Its tiles
(`DirectTiles`: gate-up 32 intermediate columns x 128-deep K steps, slot down 64 hidden columns
x 128) were set when the path was written and never swept; at T = 1 the gate-up streams its
50 MB at 3.3 TB/s from 192 programs and the down its 25 MB at 2.6 TB/s from 256 (session 16's
profile), both below the ~4.2 TB/s copy rate, so more / shorter programs may stream faster.

    PYTHONPATH=$PWD python benchmarks/s21_moe_direct_tiles_gpu.py $OUT [budget_s, default 150]

The layer of tskernels.bench.cases.moe (router logits -> routing -> fused experts, Qwen3-30B-A3B
shape, bf16, chained launches as served), T = 1 / 2 / 4 / 8, one variant at a time through
`triton_direct.DEFAULT`. Each variant is first compared with the default's output (eager;
relative rms / max within the bf16 tolerance: other K steps round differently) and checked in a
replayed CUDA graph with NaN-poisoned output; timing as benchmarks/s18_moe_pdl_gpu.py (one graph
of back-to-back layers over 4 input sets with their own 1.2 GB weight copies, two medians).
JSON: $OUT/s21_moe_direct_tiles.json; a table last.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from s18_moe_pdl_gpu import finish, replay_equal, run_variant  # noqa: E402  (this script's folder)

T0 = time.time()
# name -> DirectTiles overrides (the default first)
VARIANTS = {
    "default": {},
    "up_n16": {"up_n": 16},
    "down_n32": {"down_n": 32},
    "up_n16_down_n32": {"up_n": 16, "down_n": 32},
    "up_k256": {"up_k": 256},
    "up_k64": {"up_k": 64},
    "down_k64": {"down_k": 64},
    "down_n32_k256": {"down_n": 32, "down_k": 256},
    "up_n64": {"up_n": 64},
    "up_stages3": {"up_stages": 3},
    "up_n16_warps2": {"up_n": 16, "up_warps": 2},
}


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def rel(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    d = (got.double() - want.double())
    scale = want.double().pow(2).mean().sqrt().item() or 1.0
    return d.pow(2).mean().sqrt().item() / scale, d.abs().max().item() / want.double().abs().max().item()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
    import tskernels
    from tskernels.bench import core
    from tskernels.bench.cases import moe as mcases
    from tskernels.numerics import tolerance
    from tskernels.ops.moe import triton_direct as td
    base = td.DEFAULT
    tol = tolerance(torch.bfloat16)
    res = {"command": "python benchmarks/s21_moe_direct_tiles_gpu.py $OUT " + str(int(budget)),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(), "variants": VARIANTS, "checks": {}, "us": {}}
    res["copy_TBps"] = round(core.copy_bandwidth("cuda") / 1e3, 3)
    g = torch.Generator(device="cuda").manual_seed(5)
    try:
        with tskernels.use_backend("moe.topk_softmax=triton,moe.fused_experts=triton"):
            for t in (1, 2, 4, 8):
                if left(budget) < 25:
                    break
                sets = [mcases._make({"T": t, **mcases.QWEN3}, "cuda", g) for _ in range(4)]
                td.DEFAULT = base
                want = mcases._ours(sets[0]).clone()
                for name, over in VARIANTS.items():
                    key = f"T={t} {name}"
                    if left(budget) < 12:
                        break
                    td.DEFAULT = dataclasses.replace(base, **over)

                    def check():
                        got = mcases._ours(sets[0])
                        rms, mx = rel(got, want)
                        assert rms <= tol.rel_rms and mx <= tol.rel_max, f"rel {rms:.2e} / {mx:.2e}"
                        replay_equal(mcases._ours, sets[0], got, times=1)
                        return f"ok (rel rms {rms:.1e}, max {mx:.1e})"
                    run_variant(res, key, mcases._ours, sets, check)
                td.DEFAULT = base
                del sets
                torch.cuda.empty_cache()
    finally:
        td.DEFAULT = base
    return finish(out, "s21_moe_direct_tiles.json", res, width=28)


if __name__ == "__main__":
    sys.exit(main())
