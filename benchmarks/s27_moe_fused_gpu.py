"""Session 27 lab: the decode MoE's align-free path in one launch (triton_direct.FUSED:
slot_fused_kernel, gate-up tickets then down tickets that wait on their slot's done counter,
the down weight streamed after the wait or prefetched before it) against the shipped two
launches (gate-up, slot down), for issue 24's MoE target (Qwen3-30B-A3B layer at T = 1: 26.5 us
on the H200, read floor 17.8, target <= 21 us; H100 session 26: 34.69 us, floor 25.12).

    python benchmarks/s27_moe_fused_gpu.py OUT_DIR BUDGET_S

Qwen3-30B-A3B layer (E = 128, top-8, hidden 2048, intermediate 768, bf16): routing
(moe.topk_softmax) + moe.fused_experts through the public op, both Triton, chained as served
(pdl.CHAIN as shipped), at T = 1 / 2 / 4 / 8. Each variant's output is first compared with the
shipped path's on the same inputs (bf16 tolerance; its output and every buffer it allocates
NaN-poisoned; every counter must be re-armed after): a variant that differs or raises is
reported and not timed. Timing: tskernels.bench.core.time_fn with graph=True (back-to-back
layers in one CUDA graph over 8 input sets, each routing to its own experts, so the touched
experts' weights do not stay in L2 from call to call), medians. The read floor: the distinct
experts each set touches x their 3 H I bf16 bytes over the measured copy bandwidth (mean over
the sets). No new variant starts once BUDGET_S seconds have passed (the JSON is rewritten
after every T). Writes OUT_DIR/s27_moe_fused.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tskernels import moe
from tskernels.bench import core
from tskernels.numerics import assert_close
from tskernels.ops.moe import triton_direct as td

E, H, I, K = 128, 2048, 768, 8
F = td.FusedTiles
VARIANTS: dict[str, td.FusedTiles | None] = {
    "shipped": None,
    "f_stream": F(),
    "f_stream_w8": F(num_warps=8),
    "f_stream_s3": F(num_stages=3),
    "f_stream_up64": F(up_n=64),
    "f_stream_dn32": F(down_n=32),
    "f_pf32_w8": F(down_n=32, num_warps=8, prefetch=True),
    "f_pf32_w4": F(down_n=32, num_warps=4, prefetch=True),
    "f_pf16_w4": F(down_n=16, num_warps=4, prefetch=True),
    "f_pf16_w4_s3": F(down_n=16, num_warps=4, num_stages=3, prefetch=True),
}


def _poison_empty():
    """torch.empty filling floating tensors with NaN (restored by the returned function)."""
    real = torch.empty

    def empty(*a, **kw):
        out = real(*a, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    torch.empty = empty
    return lambda: setattr(torch, "empty", real)


def main() -> int:
    out_dir, budget = Path(sys.argv[1]), float(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=gen, device="cuda") / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=gen, device="cuda") / I ** 0.5).bfloat16()
    roof = core.copy_bandwidth("cuda")
    res = {"command": "python " + " ".join(sys.argv), "copy_roofline_GBps": round(roof, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "device": torch.cuda.get_device_name(), "shipped_fused": repr(td.FUSED),
           "variants": {k: repr(v) for k, v in VARIANTS.items()}, "rows": []}
    print(f"{res['device']}: copy roofline {roof / 1e3:.2f} TB/s; shipped td.FUSED = "
          f"{td.FUSED}", flush=True)
    keep = td.FUSED
    spent = False
    for t in (1, 2, 4, 8):
        if spent:
            break
        sets = [dict(x=torch.randn(t, H, generator=gen, device="cuda").bfloat16(),
                     logits=torch.randn(t, E, generator=gen, device="cuda")) for _ in range(8)]

        def layer(d):
            w, ids = moe.topk_softmax(d["logits"], K, backend="triton")
            return moe.fused_experts(d["x"], w13, w2, w, ids, backend="triton")

        td.FUSED = None
        ref = layer(sets[0]).float()
        touched = [len(torch.unique(moe.topk_softmax(d["logits"], K, backend="triton")[1]))
                   for d in sets]
        floor = statistics.mean(touched) * 3 * H * I * 2 / roof / 1e3
        row = {"T": t, "touched_experts": touched, "floor_us": round(floor, 2), "us": {}}
        for name, v in VARIANTS.items():
            if time.time() - t0 > budget:
                print(f"budget of {budget:.0f} s spent: no further variants", flush=True)
                spent = True
                break
            td.FUSED = v
            try:
                restore = _poison_empty()
                try:
                    got = layer(sets[0])
                    torch.cuda.synchronize()
                finally:
                    restore()
                assert_close(got, ref, dtype=torch.bfloat16, name=name)
                assert int(td._counters(got.device).abs().sum()) == 0, "counters not re-armed"
                assert int(td._fused_counters(got.device).abs().sum()) == 0, \
                    "fused counters not re-armed"
                row["us"][name] = round(statistics.median(
                    core.time_fn(layer, sets, "cuda", iters=400, graph=True)), 2)
            except Exception as e:  # noqa: BLE001 - recorded in its row, the others go on
                row.setdefault("failed", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"  T={t} {name}: {row['failed'][name][:160]} -- not timed", flush=True)
            finally:
                td.FUSED = keep
        res["rows"].append(row)
        (out_dir / "s27_moe_fused.json").write_text(json.dumps(res, indent=1))
        u = row["us"]
        if u:
            best = min(u, key=u.get)
            print(f"T={t} floor {row['floor_us']} | " + " ".join(
                f"{k} {x}" for k, x in u.items()) + f" | best {best}", flush=True)
        del sets
    td.FUSED = keep
    print(f"\ntotal {time.time() - t0:.0f} s")
    names = list(VARIANTS)
    print("| T | floor | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for r in res["rows"]:
        print(f"| {r['T']} | {r['floor_us']} | " + " | ".join(
            str(r["us"].get(n, "-")) for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
