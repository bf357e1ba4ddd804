"""Session 25 lab: the group-max sampler's six launches chained by PDL (shared/pdl.py,
"sampler"; every stage triggering at its start, or the fallback stages only once they know
they have no work: triton_groupmax.LAZY_TRIGGER) against plain launches, side by side in one process (issue 23's sampler target:
<= 25 us at B = 64 for temperature + top-k 50 + top-p 0.9 + min-p, V = 151,936 fp32).

    python benchmarks/s25_sampler_gpu.py OUT_DIR [SECONDS]

CUDA-graph replay (tskernels.bench.core.time_fn: back-to-back calls, medians), input sets
rotated past L2 (tskernels.bench.cases.sampling: randn * 3 logits, T 0.8, top-k 50, top-p 0.9,
min-p 0.05 as [B] tensors, seeds); the chained tokens are checked equal to the plain ones on
every set first (same kernels, same arithmetic: bit-equal). B = 64 also over the parameter
mixes of session 14. Writes OUT_DIR/s25_sampler.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tskernels.bench.cases import sampling as cases
from tskernels.bench.core import time_fn
from tskernels.ops.sampling import triton_groupmax as tgm
from tskernels.ops.shared import pdl

MIXES = {"k50_p0.9_minp0.05": {}, "topk50": {"p": 1.0, "minp": 0.0},
         "minp0.1": {"k": 0, "p": 1.0, "minp": 0.1},
         "topk1000_topp0.95": {"k": 1000, "p": 0.95, "minp": 0.0},
         "temperature_only": {"k": 0, "p": 1.0, "minp": 0.0}, "greedy_rows": {"T": 0.0}}


def problems(t0: float, budget: float):
    """(B, mix, input sets) of the sampler labs: the default mix at B = 64 / 256 / 1, then the
    other mixes at B = 64; sets sized to rotate past L2; stops once `budget` s from t0 pass."""
    points = [(b, "k50_p0.9_minp0.05") for b in (64, 256, 1)] + \
        [(64, m) for m in MIXES if m != "k50_p0.9_minp0.05"]
    for b, mix in points:
        if time.time() - t0 > budget:
            print("budget spent", flush=True)
            return
        gen = torch.Generator(device="cuda").manual_seed(0)
        n = 128 if b == 1 else (3 if b <= 64 else 2)
        yield b, mix, [cases._make({"B": b, "V": cases.V, **MIXES[mix]}, "cuda", gen)
                       for _ in range(n)]


def run(d):
    return tgm.run(d["logits"], **cases._params(d)).token_ids


def timed(mode: str, sets) -> float:
    """mode: plain (no chain), early (every stage triggers at its start: call 7), lazy (the
    fallback stages trigger once they know they have no work: LAZY_TRIGGER, call 8)."""
    pdl.CHAIN = frozenset(pdl.NAMES) if mode != "plain" else \
        frozenset(set(pdl.NAMES) - {"sampler"})
    tgm.LAZY_TRIGGER = mode == "lazy"
    try:
        return round(statistics.median(time_fn(run, sets, "cuda", iters=60, graph=True)), 2)
    finally:
        tgm.LAZY_TRIGGER = True


def main() -> None:
    out = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 200
    t0 = time.time()
    res = {"command": "python " + " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    for b, mix, sets in problems(t0, budget):
        same = True
        for d in sets[:3]:
            pdl.CHAIN = frozenset(set(pdl.NAMES) - {"sampler"})
            want = run(d)
            pdl.CHAIN = frozenset(pdl.NAMES)
            for lazy in (False, True):
                tgm.LAZY_TRIGGER = lazy
                same &= bool(torch.equal(run(d), want))
            tgm.LAZY_TRIGGER = True
        row = {"B": b, "mix": mix, "same_tokens": same}
        for rnd in (1, 2):  # alternated rounds
            for mode in ("plain", "early", "lazy"):
                row[f"{mode}_us_{rnd}"] = timed(mode, sets)
        res["rows"].append(row)
        print(row, flush=True)
        (out / "s25_sampler.json").write_text(json.dumps(res, indent=1))
    pdl.CHAIN = frozenset(pdl.NAMES)
    print("\nB    mix                  plain us       early us       lazy us        same")
    for r in res["rows"]:
        print(f"{r['B']:<4} {r['mix']:<20} " + "  ".join(
            f"{r[m + '_us_1']:6.2f} {r[m + '_us_2']:6.2f}" for m in ("plain", "early", "lazy"))
            + f"  {r['same_tokens']}")


if __name__ == "__main__":
    main()
