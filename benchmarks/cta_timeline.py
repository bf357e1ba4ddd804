"""Where a decode launch's time goes, CTA by CTA: the CUDA fp8 decode built with -DTIMING
stamps each CTA's entry, its warp 0's first landed tile, the end of warp 0's loop and its exit
(globaltimer, ns) and its SM. One eager launch after warm-up launches, per shape.

    TIMELINE_SHAPES=64x4096,16x4096 python benchmarks/cta_timeline.py   # -> $OUT/cta_timeline.json
    (a shape is B x L [x splits x warps x stages], 0 = the plan's choice)

Printed per shape: the span (first entry to last exit), how the entries spread (the block
scheduler's ramp), the first tile's latency, the spread of the exits (the tail), and the
active-CTA profile over the span in tenths.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

OUT = os.environ.get("OUT", "/tmp")
MAX_CTAS = 8192


def timeline(B, L, splits=None, warps=None, stages=None):
    import cupy
    from tskernels.bench.cases.attention import _make_decode
    from tskernels.ops.attention import cuda_decode
    gen = torch.Generator("cuda").manual_seed(0)
    s = _make_decode({"B": B, "L": L, "fp8": 1}, "cuda", gen)
    plan = cuda_decode.CudaDecodePlan(
        s["pt"], s["lens"], num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
        q_dtype=torch.bfloat16, kv_dtype=s["kc"].dtype, scale=128 ** -0.5, num_splits=splits,
        num_warps=warps, num_stages=stages)
    mod = cupy.RawModule(code=cuda_decode.SOURCE.read_text(),
                         options=cuda_decode.nvcc_options(plan.num_warps, plan.num_stages)
                         + (f"-DTIMING={MAX_CTAS}",))
    fn = mod.get_function("decode_fp8_kernel")
    fn.max_dynamic_shared_size_bytes = plan._smem
    plan._fn = fn
    ref = cuda_decode.CudaDecodePlan(
        s["pt"], s["lens"], num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
        q_dtype=torch.bfloat16, kv_dtype=s["kc"].dtype, scale=128 ** -0.5,
        num_splits=plan.num_splits, num_warps=plan.num_warps, num_stages=plan.num_stages)
    args = (s["q"], s["kc"], s["vc"])
    kw = dict(k_scale=s["ks"], v_scale=s["vs"])
    want = ref.run(*args, **kw)
    for _ in range(5):
        got = plan.run(*args, **kw)
    torch.cuda.synchronize()
    assert torch.equal(got, want), "the TIMING build changed the result"
    ctas = plan.num_splits * plan.hkv * B
    if ctas > MAX_CTAS:
        raise ValueError(f"{ctas} CTAs > {MAX_CTAS}")
    t = cupy.asnumpy(cupy.ndarray((MAX_CTAS * 5,), cupy.uint64,
                                  mod.get_global("cta_times")))[:ctas * 5].reshape(ctas, 5)
    sm = t[:, 4].astype(np.int64)
    ts = t[:, :4].astype(np.int64)
    ts = (ts - ts[:, 0].min()) / 1e3  # us from the first entry
    entry, first, loop_end, exit_ = ts.T
    span = exit_.max()
    per_sm = np.bincount(sm, minlength=int(sm.max()) + 1)
    grid = np.linspace(0, span, 11)
    active = [int(((entry <= x) & (exit_ > x)).sum()) for x in (grid[:-1] + grid[1:]) / 2]
    q = lambda a, p: float(np.percentile(a, p))  # noqa: E731
    row = dict(B=B, L=L, splits=plan.num_splits, warps=plan.num_warps, stages=plan.num_stages,
               ctas=ctas, span_us=span,
               entry_us={p: q(entry, p) for p in (50, 90, 100)},
               first_tile_us={p: q(first - entry, p) for p in (10, 50, 90)},
               exit_us={p: q(exit_, p) for p in (0, 10, 50, 90, 100)},
               loop_us={p: q(loop_end - first, p) for p in (10, 50, 90)},
               epilogue_us=q(exit_ - loop_end, 50),
               ctas_per_sm=np.bincount(per_sm).tolist(),
               exit_by_sm_load={int(k): q(exit_[per_sm[sm] == k], 50)
                                for k in np.unique(per_sm[sm])},
               active_tenths=active,
               raw=dict(entry=np.round(entry, 2).tolist(), exit=np.round(exit_, 2).tolist(),
                        sm=sm.tolist()))
    print(f"B={B} L={L} splits={plan.num_splits} {plan.num_warps}w{plan.num_stages}s ctas={ctas}"
          f" span {span:.1f} us | entry p50/p90/max {q(entry, 50):.1f}/{q(entry, 90):.1f}/"
          f"{entry.max():.1f} | first tile p50 {q(first - entry, 50):.1f} | loop p10/p50/p90 "
          f"{q(loop_end - first, 10):.1f}/{q(loop_end - first, 50):.1f}/"
          f"{q(loop_end - first, 90):.1f} | exit p0/p10/p50/p90/max {q(exit_, 0):.1f}/"
          f"{q(exit_, 10):.1f}/{q(exit_, 50):.1f}/{q(exit_, 90):.1f}/{span:.1f} | exit p50 by "
          f"CTAs on the SM {row['exit_by_sm_load']} | active per tenth {active}", flush=True)
    return row


if __name__ == "__main__":
    rows = []
    for spec in os.environ.get("TIMELINE_SHAPES", "64x4096,16x4096").split(","):
        parts = [int(x) for x in spec.split("x")]  # B x L [x splits x warps x stages]
        B, L = parts[:2]
        extra = dict(zip(("splits", "warps", "stages"), parts[2:]))
        rows.append(timeline(B, L, **{k: v or None for k, v in extra.items()}))
    with open(f"{OUT}/{os.environ.get('TIMELINE_OUT', 'cta_timeline.json')}", "w") as f:
        json.dump(rows, f, indent=1)
