"""Greedy argmax on the H200, issue 23 take three: torch.argmax, the two-stage default, the
opt-in loop_ticket, and the two new variants of tskernels/ops/sampling/triton.py side by
side in one process: "two_stage_pdl" (the default's kernels, the final reduction launched as
a programmatic dependent; "both" also the first stage) and "balanced" (B x S programs sized
to whole waves of per_sm x SMs, [rows, N] tiles of 16-byte loads, evict-first, PDL final /
both), with a one-knob-at-a-time sweep of balanced's knobs around BALANCED and then the
combination of the best value of each knob. fp32 at B = 1, 64, 256 and bf16 at B = 64,
V = 151,936.

Every variant's output is compared with torch.argmax before it is timed, on a random input
set and on one whose first rows hold ties, -inf rows, NaN (first NaN wins) and -0.0 / 0.0.
Timing: CUDA-graph replay of back-to-back calls (tskernels.bench.core.time_fn), input sets
rotated over >= 160 MB (L2 is 60 MB), medians; the copy roofline (1 GiB device copy) in the
same process. Also: graph replays of the PDL variants with new logits copied in, two
streams running the new variants at once (no shared state), and each compiled kernel's
registers (occupancy). JSON to OUT_DIR/s16_greedy.json, a short table last.

    PYTHONPATH=$PWD python benchmarks/s16_greedy_gpu.py OUT_DIR [SECONDS=120]

Without CUDA it runs a smoke pass under the Triton interpreter (tiny V, no timing).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from tskernels.bench.core import copy_bandwidth, time_fn  # noqa: E402
from tskernels.ops.sampling import triton as tg  # noqa: E402

OUT = Path(sys.argv[1])
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
T0 = time.time()
V = 151936 if DEV == "cuda" else 3000
ROTATE = 160 << 20
RES: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv),
             "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)",
             "V": V, "BALANCED": dataclasses.asdict(tg.BALANCED), "VARIANT": tg.VARIANT,
             "points": []}
# one knob at a time around BALANCED (fp32); the combination of the winners is timed after
SWEEP = {"pdl": ["none", "final"], "per_sm": [2, 3, 5, 6, 8], "waves": [2, 4],
         "rows": [1, 2, 8], "num_warps": [4, 16], "evict_first": [False]}
# knobs that interact (warps x programs per SM, waves x size), timed jointly at B > 1 fp32
JOINT = [{"num_warps": 4, "per_sm": 8}, {"num_warps": 4, "per_sm": 10},
         {"per_sm": 5, "waves": 2}, {"rows": 2, "per_sm": 5, "waves": 2},
         # second run: around the first run's best (4 warps, 10 per SM)
         {"num_warps": 4, "per_sm": 12}, {"num_warps": 4, "per_sm": 16},
         {"num_warps": 4, "per_sm": 10, "rows": 8}, {"num_warps": 4, "per_sm": 10, "rows": 2},
         {"num_warps": 2, "per_sm": 16}, {"num_warps": 2, "per_sm": 20},
         {"num_warps": 4, "per_sm": 10, "pdl": "final"}]
JOINT_BF16 = [{"num_warps": 4, "per_sm": 8}, {"num_warps": 4, "per_sm": 6},
              {"num_warps": 4, "per_sm": 10}, {"num_warps": 8, "per_sm": 5}]
SWEEP_B1 = {"pdl": ["none", "final"], "rows": [1, 2], "num_warps": [4]}
SWEEP_BF16 = {"pdl": ["none"], "rows": [2, 8], "per_sm": [3, 6]}
if DEV == "cpu":  # smoke run: a few interpreter launches per point
    SWEEP = SWEEP_B1 = SWEEP_BF16 = {"pdl": ["none"], "rows": [2]}
    JOINT = JOINT[:1]


def left() -> float:
    return BUDGET - (time.time() - T0)


def save() -> None:
    RES["seconds"] = round(time.time() - T0, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "s16_greedy.json").write_text(json.dumps(RES, indent=1))


def med(fn, sets) -> float | None:
    if DEV == "cpu":
        fn(sets[0])
        return None
    return round(statistics.median(time_fn(fn, sets, DEV, iters=60, graph=True)), 2)


def make_sets(b: int, dtype: torch.dtype) -> list[dict]:
    gen = torch.Generator(device=DEV).manual_seed(b)
    n = 1 if DEV == "cpu" else max(2, min(256, -(-ROTATE // (b * V * dtype.itemsize))))
    return [{"x": (torch.randn(b, V, device=DEV, generator=gen) * 3).to(dtype)}
            for _ in range(n)]


def special(x: torch.Tensor) -> torch.Tensor:
    """x with ties, -inf rows / tails, NaN (first one wins) and -0.0 == 0.0 in its rows."""
    x = x.clone()
    b = x.shape[0]
    edits = [lambda r: r.__setitem__([7, V // 2, V - 1], 1e4),
             lambda r: r.fill_(float("-inf")),
             lambda r: r.__setitem__([11, V - 5], float("nan")),
             lambda r: (r.fill_(0.0), r.__setitem__(5, -0.0)),
             lambda r: r[V // 7:].fill_(float("-inf")),
             lambda r: (r.__setitem__(V - 3, float("nan")), r.__setitem__(100, 1e4)),
             lambda r: (r[:V // 2].fill_(float("-inf")), r.__setitem__(V - 2, float("inf")))]
    for i, edit in enumerate(edits[:b]):
        edit(x[i])
    return x


def check(fn, sets, spec) -> bool:
    ok = all(torch.equal(fn(d), torch.argmax(d["x"], dim=-1)) for d in (sets[0], sets[-1]))
    return ok and torch.equal(fn({"x": spec}), torch.argmax(spec, dim=-1))


def balanced(cfg: tg.Balanced):
    return lambda d: tg.argmax(d["x"], variant="balanced", balanced=cfg)


def point(b: int, dtype: torch.dtype, roof: float | None, until: float) -> dict:
    """Time the fixed candidates, then (until the clock reads `until`) sweep balanced's knobs
    and time the combination of each knob's best value."""
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    sets = make_sets(b, dtype)
    spec = special(sets[0]["x"])
    row = {"B": b, "dtype": name, "sets": len(sets),
           "roofline_us": round(b * V * dtype.itemsize / roof / 1e3, 3) if roof else None,
           "us": {}, "equal": {}}
    RES["points"].append(row)

    def run(label, fn, sweep=False):
        if left() < 6 or (sweep and time.time() > until):
            row.setdefault("skipped", []).append(label)
            return None
        try:
            row["equal"][label] = ok = bool(check(fn, sets, spec))
            row["us"][label] = med(fn, sets) if ok else None
        except Exception as e:  # noqa: BLE001 - record and go on with the other variants
            row["equal"][label] = False
            row.setdefault("errors", {})[label] = traceback.format_exc()[-1500:]
            print(label, "failed:", e, flush=True)
        save()
        return row["us"].get(label)

    run("torch_argmax", lambda d: torch.argmax(d["x"], dim=-1))
    run("two_stage", lambda d: tg.argmax(d["x"], variant="two_stage"))
    if dtype == torch.float32:
        run("loop_ticket", lambda d: tg.argmax(d["x"], variant="loop_ticket", chunk=8192,
                                               block=1024, num_warps=8))
        run("two_stage_pdl_final",
            lambda d: tg.argmax(d["x"], variant="two_stage_pdl", pdl="final"))
    run("two_stage_pdl_both", lambda d: tg.argmax(d["x"], variant="two_stage_pdl", pdl="both"))
    base = run("balanced", balanced(tg.BALANCED))
    sweep = SWEEP_BF16 if dtype != torch.float32 else SWEEP_B1 if b == 1 else SWEEP
    best = {}
    for knob, values in sweep.items():
        scores = {getattr(tg.BALANCED, knob): base}
        for v in values:
            scores[v] = run(f"balanced_{knob}={v}",
                            balanced(dataclasses.replace(tg.BALANCED, **{knob: v})), True)
        timed = {k: t for k, t in scores.items() if t is not None}
        if timed:
            best[knob] = min(timed, key=timed.get)
    if b > 1:
        for knobs in (JOINT if dtype == torch.float32 else JOINT_BF16):
            label = "balanced_" + ",".join(f"{k}={v}" for k, v in knobs.items())
            run(label, balanced(dataclasses.replace(tg.BALANCED, **knobs)), True)
    combo = dataclasses.replace(tg.BALANCED, **best)
    row["best_knobs"] = {k: v for k, v in best.items() if v != getattr(tg.BALANCED, k)}
    if combo != tg.BALANCED:
        run("balanced_best", balanced(combo))
    row["combo"] = dataclasses.asdict(combo)
    timed = {k: t for k, t in row["us"].items() if t is not None and k != "torch_argmax"}
    if timed:
        row["fastest"] = min(timed, key=timed.get)
    print({k: row[k] for k in ("B", "dtype", "roofline_us", "fastest") if k in row},
          {k: row["us"].get(k) for k in ("torch_argmax", "two_stage", "two_stage_pdl_both",
                                        "balanced", "balanced_best")}, flush=True)
    del sets
    return row


def graph_and_streams() -> dict:
    """Graph replays of the PDL variants with fresh logits copied in; two streams running a
    new variant at once on different logits (each call owns its partials)."""
    out = {}
    b = 64 if DEV == "cuda" else 3
    gen = torch.Generator(device=DEV).manual_seed(7)
    fns = {"two_stage_pdl_both": lambda x: tg.argmax(x, variant="two_stage_pdl", pdl="both"),
           "balanced": lambda x: tg.argmax(x, variant="balanced")}
    for name, fn in fns.items():
        x = torch.randn(b, V, device=DEV, generator=gen)
        if DEV == "cpu":
            out[f"{name}_eager"] = bool(torch.equal(fn(x), torch.argmax(x, dim=-1)))
            continue
        fn(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = fn(x)
        ok = True
        for _ in range(3):
            x.copy_(torch.randn(b, V, device=DEV, generator=gen))
            g.replay()
            torch.cuda.synchronize()
            ok &= torch.equal(y, torch.argmax(x, dim=-1))
        out[f"{name}_graph_replays"] = bool(ok)
        xs = [torch.randn(b, V, device=DEV, generator=gen) for _ in range(2)]
        streams = [torch.cuda.Stream() for _ in range(2)]
        torch.cuda.synchronize()
        res = [[], []]
        for _ in range(20):
            for i, s in enumerate(streams):
                with torch.cuda.stream(s):
                    res[i].append(fn(xs[i]))
        torch.cuda.synchronize()
        out[f"{name}_two_streams"] = all(torch.equal(r, torch.argmax(xs[i], dim=-1))
                                         for i in range(2) for r in res[i])
    return out


def registers() -> list[dict]:
    """Registers and spills of every compiled _argmax_part / _argmax_chunk, with the CTAs an
    SM holds at that count (H100/H200: 64K registers, 2048 threads, 32 CTAs)."""
    rows = []
    for fn in (tg._argmax_part, tg._argmax_chunk):
        for cache in getattr(fn, "device_caches", {}).values():
            for k in cache[0].values():
                regs, warps = getattr(k, "n_regs", None), k.metadata.num_warps
                if not regs:
                    continue
                per_warp = -(-regs * 32 // 256) * 256
                ctas = min(32, 64 // warps, 65536 // (per_warp * warps))
                src = getattr(k, "src", None)
                consts = getattr(src, "constexprs", None) or getattr(src, "constants", {}) or {}
                names = fn.arg_names
                rows.append({"kernel": fn.fn.__name__, "num_warps": warps, "regs": regs,
                             "spills": getattr(k, "n_spills", None), "ctas_per_sm": ctas,
                             "constexprs": {_arg(names, a): v for a, v in consts.items()
                                            if isinstance(v, (int, bool, str))}})
    return rows


def _arg(names, key) -> str:
    i = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    return names[i] if isinstance(i, int) and i < len(names) else str(key)


def table() -> None:
    print(f"\ncopy roofline {RES.get('copy_GBps')} GB/s; us (fraction of the read roofline)")
    for row in RES["points"]:
        print(f"B={row['B']} {row['dtype']} roofline {row['roofline_us']} us, "
              f"fastest {row.get('fastest')}, best knobs {row.get('best_knobs')}")
        for k, t in sorted(row["us"].items(), key=lambda kv: kv[1] or 1e9):
            frac = f" ({row['roofline_us'] / t:.2f})" if t and row["roofline_us"] else ""
            print(f"  {k:34s} {t}{frac}{'' if row['equal'].get(k) else '  NOT EQUAL'}")


def main() -> None:
    roof = copy_bandwidth(DEV) if DEV == "cuda" else None
    RES["copy_GBps"] = round(roof, 1) if roof else None
    try:
        RES["checks"] = graph_and_streams()
    except Exception:  # noqa: BLE001
        RES["checks"] = {"error": traceback.format_exc()[-1500:]}
    print(RES["checks"], flush=True)
    save()
    # each point's sweep stops at its share of what is left (the fixed candidates always run)
    plan = ((64, torch.float32, 0.4), (256, torch.float32, 0.35), (1, torch.float32, 0.15),
            (64, torch.bfloat16, 0.1))
    share = 0.0
    start, total = time.time(), left() - 8
    for b, dtype, frac in plan:
        share += frac
        if DEV == "cpu":  # the interpreter: small batches, fp16 for bf16 (not exact there)
            b, dtype = min(b, 3), torch.float16 if dtype == torch.bfloat16 else dtype
        point(b, dtype, roof, start + share * total)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    try:
        RES["registers"] = registers() if DEV == "cuda" else []
    except Exception:  # noqa: BLE001 - Triton internals: informative only
        RES["registers"] = traceback.format_exc()[-800:]
    save()
    table()


if __name__ == "__main__":
    main()
