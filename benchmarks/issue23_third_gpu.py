"""Issue 23, third approaches on the H200, old and new side by side in one process:
greedy's two-stage argmax vs the one-launch `loop_ticket` variant (chunk / block / warps
sweep), and where the group-max sampler's time goes (per-kernel durations from the profiler,
eager launches, beside the whole pipeline's CUDA-graph time), plus any sampler pipelines
named in SAMPLE_PIPES. CUDA-graph replay, medians, input sets rotated past L2; every greedy
variant is checked equal to torch.argmax and every sampler pipeline against the default's
tokens.

    PYTHONPATH=. python benchmarks/issue23_third_gpu.py OUT_DIR [SECONDS] [stage ...]
    stages: greedy sample (default: both, until SECONDS are spent)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from tskernels.bench.cases import sampling as cases
from tskernels.bench.core import copy_bandwidth, time_fn
from tskernels.ops.sampling import triton as tgr
from tskernels.ops.sampling import triton_sample as ts

OUT = Path(sys.argv[1])
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
STAGES = sys.argv[3:] or ["greedy", "sample"]
T0 = time.time()
DEV = os.environ.get("ISSUE23_DEVICE", "cuda")  # "cpu": an interpreter smoke run, small V
if DEV == "cpu":
    cases.V = 1024
RES: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}


def left() -> float:
    return BUDGET - (time.time() - T0)


def save() -> None:
    RES["seconds"] = round(time.time() - T0, 1)
    (OUT / "issue23_third.json").write_text(json.dumps(RES, indent=1))


def med(fn, sets, iters=40, graph=True) -> float:
    if DEV == "cpu":
        iters, graph = 1, False
    return round(statistics.median(time_fn(fn, sets, DEV, iters=iters, graph=graph)), 2)


def _sets(b, n):
    gen = torch.Generator(device=DEV).manual_seed(0)
    if DEV == "cpu":
        b, n = min(b, 2), 1
    return [cases._make({"B": b, "V": cases.V}, DEV, gen) for _ in range(n)]


def _nsets(b):
    return 128 if b == 1 else (3 if b <= 64 else 2)


def greedy() -> dict:
    roof = copy_bandwidth(DEV) if DEV == "cuda" else 1e3
    rows = []
    RES["greedy"] = {"copy_GBps": round(roof, 1), "rows": rows}
    for b in (64, 256, 1):
        sets = _sets(b, _nsets(b))
        want = torch.argmax(sets[0]["logits"], -1)
        row = {"B": b, "roofline_us": round(b * cases.V * 4 / roof / 1e3, 2),
               "torch_argmax_us": med(lambda d: torch.argmax(d["logits"], -1), sets),
               "two_stage_us": med(lambda d: tgr.argmax(d["logits"], variant="two_stage"), sets),
               "loop_ticket_default_us": med(
                   lambda d: tgr.argmax(d["logits"], variant="loop_ticket"), sets)}
        ok = torch.equal(tgr.argmax(sets[0]["logits"], variant="loop_ticket"), want)
        sweep = {}
        chunks = (2048, 4096, 8192, 16384) if b > 1 else (1024, 2048, 4096)
        for chunk in chunks:
            for block in (1024, 2048, 4096):
                for w in (4, 8):
                    if block > chunk or w * 32 * 4 > block:
                        continue
                    fn = lambda d, c=chunk, k=block, w=w: tgr.argmax(  # noqa: E731
                        d["logits"], variant="loop_ticket", chunk=c, block=k, num_warps=w)
                    ok &= torch.equal(fn(sets[0]), want)
                    sweep[f"c{chunk}_b{block}_w{w}"] = med(fn, sets)
            if left() < 10:
                break
        best = min(sweep, key=sweep.get) if sweep else None
        row.update(sweep=sweep, best=best, best_us=sweep.get(best), equal_to_torch=bool(ok))
        rows.append(row)
        print({k: v for k, v in row.items() if k != "sweep"}, flush=True)
        save()
        del sets
        if left() < 8:
            break
    return {"copy_GBps": round(roof, 1), "rows": rows}


def _kernel_profile(fn, d, reps=20) -> dict:
    """Mean device time per launch of every kernel in `fn(d)` (eager, after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(d)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(d)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            t = getattr(e, "device_time_total", None) or e.cuda_time_total
            out[e.key[:60]] = round(t / e.count, 2)
    return out


STAGE_NAMES = ("row stats", "load group maxima", "bound L (bisection)", "group ids",
               "gather + compact", "finish (sort, rules, race)")
try:  # the plan's clock64 stamps exist from session 14's tree on
    from tskernels.ops.sampling import triton_groupmax as tgm
    PLAN_PROFILE = "prof_ptr" in tgm._gm_plan.arg_names
except Exception:  # noqa: BLE001 - an older tree: no stamps
    PLAN_PROFILE = False


TUNINGS = {"plan_w8": {"plan_warps": 8}, "iters16": {"iters": 16},
           "plan_w8_iters16": {"plan_warps": 8, "iters": 16}}


def _plan_stages(d, reps=5) -> dict:
    """Median SM cycles per stage of _gm_plan (stamps 0, 1, 6, 2, 3, 4, 5), over rows and
    reps; the stages a row skips are left out."""
    b = d["logits"].shape[0]
    order = (0, 1, 6, 2, 3, 4, 5)
    per = {n: [] for n in STAGE_NAMES}
    for _ in range(reps):
        prof = torch.full((b, 8), -1, dtype=torch.int64, device=DEV)
        ts.run(d["logits"], **cases._params(d), pipeline="groupmax", tuning={"profile": prof})
        torch.cuda.synchronize()
        p = prof.cpu()
        for r in range(b):
            for name, (a, z) in zip(STAGE_NAMES, zip(order, order[1:])):
                if p[r, a] >= 0 and p[r, z] >= 0:
                    per[name].append(int(p[r, z] - p[r, a]))
    return {n: (statistics.median(v) if v else None) for n, v in per.items()}


def sample() -> dict:
    rows = []
    RES["sample"] = {"rows": rows}
    pipes = ["groupmax"] + [p for p in os.environ.get("SAMPLE_PIPES", "").split(",") if p]

    def pipe(name):
        return lambda d: ts.run(d["logits"], **cases._params(d), pipeline=name).token_ids

    for b in (64, 256, 1):
        sets = _sets(b, _nsets(b))
        want = pipe("groupmax")(sets[0])
        row = {"B": b, "mix": "k50_p0.9_minp0.05"}
        for p in pipes:
            row[f"{p}_us"] = med(pipe(p), sets)
            row[f"{p}_same_tokens"] = bool(torch.equal(pipe(p)(sets[0]), want))
        if PLAN_PROFILE:   # plan launch variants (same tokens: they only move the bound)
            for name, tun in TUNINGS.items():
                fn = lambda d, tun=tun: ts.run(d["logits"], **cases._params(d),  # noqa: E731
                                               pipeline="groupmax", tuning=tun).token_ids
                row[f"groupmax_{name}_us"] = med(fn, sets)
                row[f"groupmax_{name}_same_tokens"] = bool(torch.equal(fn(sets[0]), want))
        if DEV == "cuda":
            for p in pipes:
                row[f"{p}_kernels_eager_us"] = _kernel_profile(pipe(p), sets[0])
            if PLAN_PROFILE:
                row["plan_stages_cycles"] = _plan_stages(sets[0])
        rows.append(row)
        print(row, flush=True)
        save()
        del sets
        if left() < 8:
            break
    mixes = {"topk50": {"p": 1.0, "minp": 0.0}, "minp0.1": {"k": 0, "p": 1.0, "minp": 0.1},
             "topk1000_topp0.95": {"k": 1000, "p": 0.95, "minp": 0.0},
             "temperature_only": {"k": 0, "p": 1.0, "minp": 0.0},
             "greedy_rows": {"T": 0.0}, "topp0.9_alone": {"k": 0, "p": 0.9, "minp": 0.0}}
    mix_rows = {}
    RES["sample"]["mixes_B64"] = mix_rows
    for name, mix in mixes.items():
        if left() < 10:
            break
        gen = torch.Generator(device=DEV).manual_seed(0)
        b = 64 if DEV == "cuda" else 2
        sets = [cases._make({"B": b, "V": cases.V, **mix}, DEV, gen) for _ in range(3)]
        mix_rows[name] = med(pipe("groupmax"), sets)
        print(name, mix_rows[name], flush=True)
        save()
    return {"rows": rows, "mixes_B64": mix_rows,
            "note": "V=151936 fp32 logits randn*3, T=0.8, top-k 50, top-p 0.9, min-p 0.05 as "
                    "[B] tensors with seeds (mixes: the named parameters changed)"}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    RES["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    ok = True
    for stage in STAGES:
        if left() < 5:
            break
        try:
            RES[stage] = {"greedy": greedy, "sample": sample}[stage]()
        except Exception:
            ok = False
            RES[stage + "_error"] = traceback.format_exc()[-3000:]
            traceback.print_exc()
        save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
