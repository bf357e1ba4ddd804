"""Session 24 lab: the decode MoE layer's experts on the CUDA cores (triton_direct.rows_experts)
against the tensor-core align-free kernels (issue 24's MoE T = 1 target, <= 21 us a layer).
The rows form was 1.2-1.5x slower (s24_moe_rows.json) and was removed again: this script runs
against commit f4288e7, where triton_direct.rows_experts / ROWS exist.

    python benchmarks/s24_moe_rows_gpu.py OUT_DIR

Qwen3-30B-A3B layer (E = 128, top-8, hidden 2048, intermediate 768, bf16): routing
(moe.topk_softmax) + moe.fused_experts through the public op, both Triton, chained as served,
at T = 1 / 2 / 4 / 8. Each variant's output is first compared with the shipped path's (bf16
tolerance; NaN-poisoned), then the layer is timed by CUDA-graph replay of back-to-back calls
over 8 input sets (each routes to its own experts: the 8 touched experts' 75 MB do not stay in
the 50 MB L2 across calls), medians. Writes OUT_DIR/s24_moe_rows.json; prints a table.
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
VARIANTS = {
    "shipped": "keep",
    "tc": None,
    "rows": {},
    "rows_up2x2048": dict(up_n=2, up_k=2048),
    "rows_up8x1024w8": dict(up_n=8, up_k=1024, up_warps=8),
    "rows_up4x2048": dict(up_k=2048),
    "rows_dn8": dict(down_n=8),
    "rows_dn2": dict(down_n=2),
    "rows_dn4x512": dict(down_k=512),
    "rows_dn8x256w8": dict(down_n=8, down_warps=8),
}


def main() -> None:
    out_dir = Path(sys.argv[1])
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=gen, device="cuda") / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=gen, device="cuda") / I ** 0.5).bfloat16()
    roof = core.copy_bandwidth("cuda")
    res = {"command": "python " + " ".join(sys.argv), "copy_roofline_GBps": round(roof, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "shipped_rows": td.ROWS, "rows": []}
    print(f"copy roofline {roof / 1e3:.2f} TB/s; shipped td.ROWS = {td.ROWS}", flush=True)
    for t in (1, 2, 4, 8):
        sets = [dict(x=torch.randn(t, H, generator=gen, device="cuda").bfloat16(),
                     logits=torch.randn(t, E, generator=gen, device="cuda")) for _ in range(8)]

        def layer(d):
            w, ids = moe.topk_softmax(d["logits"], K, backend="triton")
            return moe.fused_experts(d["x"], w13, w2, w, ids, backend="triton")
        ref = layer(sets[0]).float()
        touched = len(torch.unique(moe.topk_softmax(sets[0]["logits"], K, backend="triton")[1]))
        row = {"T": t, "touched_experts": touched,
               "floor_us": round(touched * 3 * H * I * 2 / roof / 1e3, 2), "us": {}}
        keep = td.ROWS
        for name, v in VARIANTS.items():
            td.ROWS = keep if v == "keep" else v
            try:
                got = layer(sets[0])
                torch.cuda.synchronize()
                assert_close(got, ref, dtype=torch.bfloat16, name=name)
                row["us"][name] = round(statistics.median(
                    core.time_fn(layer, sets, "cuda", iters=400, graph=True)), 2)
            except Exception as e:  # noqa: BLE001 - recorded in its row
                row.setdefault("failed", {})[name] = f"{type(e).__name__}: {str(e)[:200]}"
            finally:
                td.ROWS = keep
        res["rows"].append(row)
        best = min(row["us"], key=row["us"].get)
        print(f"T={t} floor {row['floor_us']} | " + " ".join(
            f"{k} {v}" for k, v in row["us"].items()) + f" | best {best}", flush=True)
    (out_dir / "s24_moe_rows.json").write_text(json.dumps(res, indent=1))
    print("\nT  floor  shipped  tc  rows  best")
    for r in res["rows"]:
        u = r["us"]
        best = min(u, key=u.get)
        print(f"{r['T']}  {r['floor_us']}  {u.get('shipped')}  {u.get('tc')}  {u.get('rows')}  "
              f"{best} {u[best]}")


if __name__ == "__main__":
    main()
