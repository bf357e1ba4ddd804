"""Session 33 lab: the group-max sampler's plan from the chunks' top-T lists
(triton_groupmax.TOPT; 0 = the full scan of the row's group maxima) side by side in one
process (issue 23's sampler target: <= 25 us at B = 64 for temperature + top-k 50 + top-p 0.9
+ min-p, V = 151,936 fp32).

    python benchmarks/s33_sampler_topt_gpu.py OUT_DIR [SECONDS]

CUDA-graph replay (tskernels.bench.core.time_fn: back-to-back calls, medians), input sets
rotated past L2 (tskernels.bench.cases.sampling: randn * 3 logits, T 0.8, top-k 50, top-p 0.9,
min-p 0.05 as [B] tensors, seeds) with the shipped PDL chain; every form's tokens are checked
equal to TOPT = 0's on every set first (the same groups are selected). B = 64 also over the
parameter mixes of session 14. Writes OUT_DIR/s33_sampler_topt.json; prints a table last.
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

sys.path.insert(0, str(Path(__file__).parent))
from s25_sampler_gpu import problems  # noqa: E402  (the same problems and input sets)

FORMS = (0, 4, 8, 16)


def run(d, topt):
    return tgm.run(d["logits"], **cases._params(d), topt=topt)


def timed(topt: int, sets) -> float:
    return round(statistics.median(
        time_fn(lambda d: run(d, topt).token_ids, sets, "cuda", iters=60, graph=True)), 2)


def main() -> None:
    out = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 200
    t0 = time.time()
    res = {"command": "python " + " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(), "forms": list(FORMS), "rows": []}
    for b, mix, sets in problems(t0, budget):
        same = True
        for d in sets[:3]:
            want = run(d, 0)
            for t in FORMS[1:]:
                got = run(d, t)
                same &= bool(torch.equal(got.token_ids, want.token_ids))
                same &= bool(torch.allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-5))
        row = {"B": b, "mix": mix, "same_tokens": same}
        for rnd in (1, 2):  # alternated rounds
            for t in FORMS:
                row[f"topt{t}_us_{rnd}"] = timed(t, sets)
        res["rows"].append(row)
        print(row, flush=True)
        (out / "s33_sampler_topt.json").write_text(json.dumps(res, indent=1))
    print("\nB    mix                  " + "".join(f"topt {t:<2} us     " for t in FORMS)
          + "same")
    for r in res["rows"]:
        print(f"{r['B']:<4} {r['mix']:<20} " + "  ".join(
            f"{r[f'topt{t}_us_1']:6.2f} {r[f'topt{t}_us_2']:6.2f}" for t in FORMS)
            + f"  {r['same_tokens']}")


if __name__ == "__main__":
    main()
