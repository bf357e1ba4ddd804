"""Session 29 lab (issue 24's MoE T = 8192 target): the aligned path's GEMMs with the expert
weights (and the down's activations) read through tensor descriptors (triton_experts.TMA_WEIGHTS,
kernels in tskernels/ops/moe/triton_gemm_tma.py) against the shipped pointer-load kernels,
Qwen3-30B-A3B layer (E 128, top-8, H 2048, I 768, bf16), routing + align + experts + combine
as served, at the tiles the shipped lookup gives each T, plus deeper gate-up / down pipelines
for the descriptor form (its operand tiles sit in shared memory only).

    python benchmarks/s29_moe_tma_gpu.py OUT_DIR [BUDGET_S]

Each form's output is compared with the shipped one's first (bf16 bound); CUDA-graph replay
over 2 rotated weight copies (1.2 GB each), medians, two alternated rounds; TFLOP/s over the
routed rows. Writes OUT_DIR/s29_moe_tma.json, prints a table last.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import tskernels
from tskernels.bench.cases import moe as cases
from tskernels.bench.core import time_fn
from tskernels.ops.moe import _tune, triton_experts as te

BACKEND = "moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton"


def main() -> None:
    out = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 200
    t_end = time.time() + budget
    res = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (8192, 2048, 1024):
        if time.time() > t_end:
            break
        shape = {"T": t, **cases.QWEN3}
        sets = [cases._make(shape, "cuda", gen) for _ in range(2)]
        base, _ = _tune.launch(t, 2048, 768, 128, 8, False, torch.device("cuda"))
        forms = {"pointer": (False, base), "tma": (True, base),
                 "tma_up4": (True, dataclasses.replace(base, up_stages=4)),
                 "tma_dn3": (True, dataclasses.replace(base, down_stages=3)),
                 "tma_up4_dn3": (True, dataclasses.replace(base, up_stages=4, down_stages=3))}
        row = {"T": t, "tiles": dataclasses.asdict(base)}

        def layer(d, use, tiles):
            w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
            te.TMA_WEIGHTS = use
            try:
                return te.experts(d["x"], d["w13"], d["w2"], w, ids, tiles=tiles)
            finally:
                te.TMA_WEIGHTS = False

        with tskernels.use_backend(BACKEND):
            want = layer(sets[0], False, base).float()
            for name, (use, tiles) in forms.items():
                try:
                    got = layer(sets[0], use, tiles).float()
                    err = ((got - want).norm() / want.norm()).item()
                    row[f"{name}_relerr"] = err
                    if not err < 1e-2:
                        print(f"T={t} {name}: WRONG rel err {err}", flush=True)
                        forms[name] = None
                except Exception as e:  # a failing form is recorded, the others still run
                    row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
                    print(f"T={t} {name}: {row[f'{name}_error']}", flush=True)
                    forms[name] = None
            for rnd in (1, 2):
                for name, f in forms.items():
                    if f is None:
                        continue
                    us = time_fn(lambda d, f=f: layer(d, *f), sets, "cuda", iters=10,
                                 graph=True)
                    med = statistics.median(us)
                    row[f"{name}_us_{rnd}"] = round(med, 1)
                    row[f"{name}_tflops_{rnd}"] = round(cases._flops(shape) / med / 1e6, 1)
        res["rows"].append(row)
        print({k: v for k, v in row.items() if k != "tiles"}, flush=True)
        (out / "s29_moe_tma.json").write_text(json.dumps(res, indent=1))
        del sets
        torch.cuda.empty_cache()
    names = ["pointer", "tma", "tma_up4", "tma_dn3", "tma_up4_dn3"]
    print("\nT      " + "".join(n.rjust(22) for n in names) + "   (us, round 1 / 2)")
    for r in res["rows"]:
        cells = []
        for n in names:
            a, b = r.get(f"{n}_us_1"), r.get(f"{n}_us_2")
            cells.append(("-" if a is None else f"{a:.0f} / {b:.0f}").rjust(22))
        print(f"{r['T']:<6} " + "".join(cells))


if __name__ == "__main__":
    main()
