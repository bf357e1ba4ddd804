"""Session 27 lab: the Triton paged decode's live split count (triton_decode.LIVE_SPLITS).

A decode plan sizes its split count for the page table's capacity (serving: the CUDA-graph
capture's max_seq_len), so a short live context ran on ~64 near-empty splits and a merge of 64
partials per head. With LIVE_SPLITS the kernel takes choose_splits at the live length. Three
plans per (shape, live length), all on the same caches:
  - "capacity": the plan for a 64k-key page table, LIVE_SPLITS off (what shipped before);
  - "live": the same plan, LIVE_SPLITS on (the new default);
  - "exact": a plan built for the live length itself (what an eager plan with the true
    max_seq_len gives: the target the live rule should reach).

    python benchmarks/s27_live_splits_gpu.py OUT_DIR BUDGET_S

Each variant is first compared with the float32 reference on set 0 (a failing variant is
reported, not timed). Timing: tskernels.bench.core.time_fn(graph=True), back-to-back calls in one
CUDA graph over request sets whose pages rotate past 120 MB, medians; the copy roofline of the
K/V bytes from the same run. Writes OUT_DIR/s27_live_splits.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

import tskernels.ops.attention as attn
from tskernels.bench import core
from tskernels.ops.attention import triton_decode as td
from tskernels_ref import attention as ref

PAGE = 16
CAPACITY = 65536
ROTATE = 120 << 20
SHAPES = {"qwen3-30b-a3b": (32, 4), "llama-3-8b": (32, 8)}  # (query heads, KV heads), d 128
LENS = [176, 1024, 4096, 16384, 51712]


def _sets(hq, hkv, length, gen):
    kv_bytes = length * hkv * 128 * 2 * 2
    count = min(256, max(2, -(-ROTATE // max(kv_bytes, 1))))
    pages = -(-length // PAGE)
    pool = count * pages + 1
    k = torch.randn(pool, PAGE, hkv, 128, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(pool, PAGE, hkv, 128, generator=gen, device="cuda").to(torch.bfloat16)
    order = torch.randperm(pool - 1, generator=gen, device="cuda").to(torch.int32) + 1
    sets = []
    for i in range(count):
        table = torch.zeros(1, CAPACITY // PAGE, dtype=torch.int32, device="cuda")
        table[0, :pages] = order[i * pages:(i + 1) * pages]
        sets.append(dict(table=table, lens=torch.tensor([length], dtype=torch.int32,
                                                        device="cuda"),
                         q=torch.randn(1, hq, 128, generator=gen, device="cuda").to(
                             torch.bfloat16),
                         out=torch.empty(1, hq, 128, dtype=torch.bfloat16, device="cuda")))
    return k, v, sets, kv_bytes


def _plans(sets, k, hq, variant, length):
    td.LIVE_SPLITS = variant == "live"
    try:
        for s in sets:
            s["plan"] = attn.decode_plan(
                s["table"], s["lens"], num_q_heads=hq, k_cache=k, q_dtype=torch.bfloat16,
                max_seq_len=length if variant == "exact" else CAPACITY, backend="triton")
    finally:
        td.LIVE_SPLITS = True
    return sets[0]["plan"]


def main():
    out_dir, budget = Path(sys.argv[1]), float(sys.argv[2])
    t_end = time.time() + budget
    gen = torch.Generator(device="cuda").manual_seed(0)
    roof = core.copy_bandwidth("cuda")  # GB/s, read + write
    rows = []
    for name, (hq, hkv) in SHAPES.items():
        for length in LENS:
            if time.time() > t_end - 20:
                print("budget: stopping before", name, length, flush=True)
                break
            k, v, sets, kv_bytes = _sets(hq, hkv, length, gen)
            s0 = sets[0]
            truth = ref.decode(s0["q"].float().cpu(), k.float().cpu(), v.float().cpu(),
                               s0["table"].cpu(), s0["lens"].cpu())
            row = dict(model=name, keys=length, hq=hq, hkv=hkv, kv_mb=round(kv_bytes / 1e6, 2),
                       floor_us=round(kv_bytes / (roof * 1e3), 2), sets=len(sets))
            for variant in ("capacity", "live", "exact"):
                plan = _plans(sets, k, hq, variant, length)
                s0["out"].fill_(float("nan"))
                s0["plan"].run(s0["q"], k, v, out=s0["out"])
                err = (s0["out"].float().cpu() - truth).abs().max().item()
                row[f"{variant}_splits"] = plan.num_splits if plan.live is None else \
                    td.live_splits(length, plan.num_splits, *plan.live)
                row[f"{variant}_err"] = err
                if not err < 3e-2:
                    row[variant] = None
                    print(f"{name} {length} {variant}: max error {err}: not timed", flush=True)
                    continue
                ts = core.time_fn(lambda s: s["plan"].run(s["q"], k, v, out=s["out"]), sets,
                                  "cuda", iters=200, graph=True)
                row[variant] = round(statistics.median(ts), 2)
            rows.append(row)
            print(row, flush=True)
            del k, v, sets
            torch.cuda.empty_cache()
    doc = dict(command=f"python benchmarks/s27_live_splits_gpu.py $OUT {sys.argv[2]}",
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               device=torch.cuda.get_device_name(), copy_roofline_GBps=round(roof, 1),
               capacity=CAPACITY, page=PAGE, rows=rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "s27_live_splits.json").write_text(json.dumps(doc, indent=1))
    print(f"\ndecode + merge, B = 1, bf16 cache, d 128, graph replay, us "
          f"(copy roofline {roof / 1e3:.2f} TB/s; splits in brackets)")
    print("| model | keys | floor | capacity | live | exact |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cell = lambda v: f"{r[v]} ({r[v + '_splits']})"  # noqa: E731
        print(f"| {r['model']} | {r['keys']} | {r['floor_us']} | {cell('capacity')} | "
              f"{cell('live')} | {cell('exact')} |")


if __name__ == "__main__":
    main()
