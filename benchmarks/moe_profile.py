"""Where the fused-MoE layer's time goes: per-kernel device time (torch.profiler, CUDA-graph
replay of 8 layer calls over 2 rotated weight copies), Qwen3-30B-A3B layer shape.

    python benchmarks/moe_profile.py [--tokens 1 8192] [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch

import tskernels
from tskernels.bench.cases import moe as cases

BACKEND = "moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton"


def profile(t: int, calls: int = 8) -> list[tuple[str, float]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [cases._make({"T": t, **cases.QWEN3}, "cuda", gen) for _ in range(2)]
    with tskernels.use_backend(BACKEND):
        for s in sets:
            cases._ours(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                cases._ours(sets[i % 2])
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    reps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / (reps * calls)) for e in prof.key_averages()
            if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8192])
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {}
    for t in a.tokens:
        rows = profile(t)
        out[f"T={t}"] = [{"kernel": k, "us_per_layer": round(v, 2)} for k, v in rows]
        print(f"T={t}: total {sum(v for _, v in rows):.1f} us per layer call")
        for k, v in rows[:8]:
            print(f"  {v:8.2f} us  {k[:80]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
