"""Issue 23's second approaches on the H200, old and new side by side in one process:
the sampler's histogram vs group-max pipelines, greedy's two-stage vs one-launch ticket argmax
(chunk / warps sweep), and the GDN prefill WY-kernel launches (key reload, 4 vs 8 warps).
CUDA-graph replay (sampling, greedy) or CUDA events (prefill), medians, input sets rotated
past L2; every stage checks that old and new give the same tokens / values.

    PYTHONPATH=. python benchmarks/issue23_second_gpu.py OUT_DIR [SECONDS] [stage ...]
    stages: sample greedy prefill (default: all, in that order, until SECONDS are spent)
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

from tskernels.bench.cases import gdn as gcases
from tskernels.bench.cases import sampling as cases
from tskernels.bench.core import copy_bandwidth, time_fn
from tskernels.ops.sampling import triton as tgr
from tskernels.ops.sampling import triton_sample as ts

OUT = Path(sys.argv[1])
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
STAGES = sys.argv[3:] or ["sample", "greedy", "prefill"]
T0 = time.time()
DEV = os.environ.get("ISSUE23_DEVICE", "cuda")  # "cpu": an interpreter smoke run, small V
if DEV == "cpu":
    cases.V = 1024
RES: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}


def left() -> float:
    return BUDGET - (time.time() - T0)


def save() -> None:
    RES["seconds"] = round(time.time() - T0, 1)
    (OUT / "issue23_second.json").write_text(json.dumps(RES, indent=1))


def med(fn, sets, iters=40, graph=True) -> float:
    if DEV == "cpu":
        iters, graph = 1, False
    return round(statistics.median(time_fn(fn, sets, DEV, iters=iters, graph=graph)), 2)


def _sets(shape, n):
    gen = torch.Generator(device=DEV).manual_seed(0)
    return [cases._make(shape, DEV, gen) for _ in range(n)]


def sample() -> dict:
    rows = []
    RES["sample"] = {"rows": rows}  # saved after every row: a stopped run keeps what it has

    def pipe(name, **kw):
        return lambda d: ts.run(d["logits"], **cases._params(d), pipeline=name, **kw).token_ids

    batches = [int(b) for b in os.environ.get("ISSUE23_SAMPLE_B", "64,256,1").split(",")]
    for b in batches:
        sets = _sets({"B": b, "V": cases.V}, 3 if b <= 64 else 2)
        if b == 1:
            sets = _sets({"B": 1, "V": cases.V}, 128 if DEV == "cuda" else 2)
        elif DEV == "cpu":
            sets = _sets({"B": 2, "V": cases.V}, 1)
        same = bool(torch.equal(pipe("histogram")(sets[0]), pipe("groupmax")(sets[0])))
        row = {"B": b, "mix": "k50_p0.9_minp0.05", "same_tokens": same,
               "histogram_us": med(pipe("histogram"), sets),
               "groupmax_us": med(pipe("groupmax"), sets)}
        if b == 64:
            row["topk_first_torch_us"] = med(cases.torch_topk_first, sets)
            for w in (4, 16):
                row[f"groupmax_stats_warps{w}_us"] = med(
                    pipe("groupmax", tuning={"stats_warps": w}), sets)
        rows.append(row)
        print(row, flush=True)
        save()
        del sets
        if left() < 8:
            return {"rows": rows}
    mixes = {"k50": dict(p=1.0, minp=0.0), "minp0.1": dict(k=0, p=1.0, minp=0.1),
             "greedy": dict(T=0.0, k=0, p=1.0, minp=0.0), "k1000_p0.95": dict(k=1000, p=0.95),
             "temperature_only": dict(k=0, p=1.0, minp=0.0), "p0.9": dict(k=0, minp=0.0)}
    for name, kw in mixes.items():
        if left() < 6:
            break
        sets = _sets({"B": 64, "V": cases.V, **kw}, 3)
        row = {"B": 64, "mix": name,
               "same_tokens": bool(torch.equal(pipe("histogram")(sets[0]),
                                               pipe("groupmax")(sets[0]))),
               "groupmax_us": med(pipe("groupmax"), sets, iters=20)}
        row["histogram_us"] = med(pipe("histogram"), sets, iters=20)
        rows.append(row)
        print(row, flush=True)
        save()
    return {"rows": rows, "note": "V=151936 fp32 logits randn*3, T=0.8 unless the mix says "
                                  "otherwise; per-request [B] parameter tensors and seeds"}


def greedy() -> dict:
    roof = copy_bandwidth(DEV) if DEV == "cuda" else 1e3
    rows = []
    RES["greedy"] = {"copy_GBps": round(roof, 1), "rows": rows}
    for b in (64, 256, 1):
        sets = _sets({"B": b, "V": cases.V}, 3 if b <= 64 else 2)
        if b == 1:
            sets = _sets({"B": 1, "V": cases.V}, 128 if DEV == "cuda" else 2)
        elif DEV == "cpu":
            sets = _sets({"B": 2, "V": cases.V}, 1)
        want = torch.argmax(sets[0]["logits"], -1)
        row = {"B": b, "roofline_us": round(b * cases.V * 4 / roof / 1e3, 2),
               "torch_argmax_us": med(lambda d: torch.argmax(d["logits"], -1), sets),
               "two_stage_us": med(lambda d: tgr.argmax(d["logits"], variant="two_stage"), sets),
               "ticket_us": med(lambda d: tgr.argmax(d["logits"], variant="ticket"), sets),
               "ticket_default_chunk": tgr._ticket_chunk(b, cases.V)}
        ok = torch.equal(tgr.argmax(sets[0]["logits"], variant="ticket"), want)
        sweep = {}
        for chunk in ((1024, 2048, 4096, 8192) if b != 256 else (4096, 8192)):
            for w in (4, 8):
                fn = lambda d, c=chunk, w=w: tgr.argmax(d["logits"], variant="ticket",  # noqa: E731
                                                       chunk=c, num_warps=w)
                ok &= torch.equal(fn(sets[0]), want)
                sweep[f"chunk{chunk}_w{w}"] = med(fn, sets)
        row.update(sweep=sweep, equal_to_torch=bool(ok))
        rows.append(row)
        print(row, flush=True)
        save()
        del sets
        if left() < 8:
            break
    return {"copy_GBps": round(roof, 1), "rows": rows}


PREFILL_TUNING = {"old_8w": {}, "reload_8w": {"wy_reload": True},
                  "reload_4w": {"wy_reload": True, "wy_warps": 4}, "noreload_4w": {"wy_warps": 4}}


def prefill() -> dict:
    import tskernels
    spec = next(k for k in tskernels.kernels("gdn", "chunk_prefill") if k.backend == "triton")
    rows = []
    RES["prefill"] = {"rows": rows}
    for shape in ({"T": 16384, "N": 1}, {"T": 32768, "N": 8}, {"T": 4096, "N": 1},
                  {"T": 65536, "N": 1}):
        if left() < 12:
            break
        gen = torch.Generator(device=DEV).manual_seed(0)
        sets = [gcases._make_prefill(shape, DEV, gen) for _ in range(2)]
        row = {"shape": shape}
        ref_o = None
        for name, tun in PREFILL_TUNING.items():
            fn = lambda d, tun=tun: spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"],  # noqa: E731
                                            cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True,
                                            tuning=tun)
            o, final = fn(sets[0])
            if ref_o is None:
                ref_o, ref_f = o.float(), final
            row[f"{name}_max_diff"] = max(float((o.float() - ref_o).abs().max()),
                                          float((final - ref_f).abs().max()))
            us = med(fn, sets, iters=10, graph=False)
            row[f"{name}_us"] = us
            row[f"{name}_Mtok_s"] = round(shape["T"] / us, 2)
        rows.append(row)
        print(row, flush=True)
        save()
        del sets
    return {"rows": rows, "note": "eager, CUDA events, median of 10, 2 input sets; Qwen3-Next "
                                  "GDN shapes (16 key / 32 value heads, 128 x 128, bf16)"}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    RES["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    ok = True
    for stage in STAGES:
        try:
            RES[stage] = {"sample": sample, "greedy": greedy, "prefill": prefill}[stage]()
        except Exception:
            ok = False
            RES[stage + "_error"] = traceback.format_exc()[-3000:]
            traceback.print_exc()
        save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
