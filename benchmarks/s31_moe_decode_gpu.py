"""Session 31 lab: the one-token CUDA MoE kernel (moe.fused_experts.cuda_sm90: one launch,
each CTA's down rows TMA-copied into shared memory during its gate-up stream) against the
shipped Triton decode path (two launches, triton_direct), for issue 24's MoE T = 1 target
(Qwen3-30B-A3B layer: 26.5 us on the H200, read floor 17.8, target <= 21 us; H100 session 27:
34.66 us, floor 25.11).

    python benchmarks/s31_moe_decode_gpu.py OUT_DIR BUDGET_S

E = 128, top-8, hidden 2048, intermediate 768, bf16. "layer": routing (moe.topk_softmax,
Triton) + moe.fused_experts; "experts": fused_experts alone on precomputed routing. Each
form's output is first compared with float64 (bf16 tolerance) and with the Triton path's.
Timing: tskernels.bench.core.time_fn with graph=True over 8 input sets, each routing to its
own experts (so the touched weights do not stay in L2 between calls), medians, two alternated
rounds. The read floor: distinct experts touched x 3 H I bf16 bytes over the measured copy
bandwidth. Writes OUT_DIR/s31_moe_decode.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

import tskernels_ref.moe as ref
from tskernels import moe
from tskernels.bench import core
from tskernels.numerics import assert_close
from tskernels.ops.moe import cuda_decode_sm90 as md

E, H, I, K = 128, 2048, 768, 8
# the CUDA kernel as selected (a programmatic dependent of the routing), plain-launched, and
# with its down rows copied only after the wait (what the prefetch is worth)
FORMS = {"triton": "triton", "cuda": "cuda_sm90", "cuda_nopdl": ("NOPDL",),
         "cuda_late_copy": ("-DLATE_COPY",)}


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
           "device": torch.cuda.get_device_name(), "rows": []}
    print(f"{res['device']}: copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    sets = []
    for _ in range(8):
        d = dict(x=torch.randn(1, H, generator=gen, device="cuda").bfloat16(),
                 logits=torch.randn(1, E, generator=gen, device="cuda"))
        d["w"], d["ids"] = moe.topk_softmax(d["logits"], K, backend="triton")
        sets.append(d)
    touched = [len(torch.unique(d["ids"])) for d in sets]
    floor = statistics.mean(touched) * 3 * H * I * 2 / roof / 1e3
    res["floor_us"] = round(floor, 2)

    def fe(x, w, ids, backend):
        if isinstance(backend, tuple):  # a lab variant of the CUDA kernel (extra -D options)
            if backend == ("NOPDL",):
                md.PDL = False
                try:
                    return md.run(x, w13, w2, w, ids)
                finally:
                    md.PDL = True
            return md.run(x, w13, w2, w, ids, extra=backend)
        return moe.fused_experts(x, w13, w2, w, ids, backend=backend)

    def layer(backend):
        def f(d):
            w, ids = moe.topk_softmax(d["logits"], K, backend="triton")
            return fe(d["x"], w, ids, backend)
        return f

    def experts(backend):
        return lambda d: fe(d["x"], d["w"], d["ids"], backend)

    checks = {}
    d = sets[0]
    want = ref.fused_experts(d["x"].cpu().double(), w13.cpu().double(), w2.cpu().double(),
                             d["w"].cpu(), d["ids"].cpu())
    got = {n: experts(b)(d) for n, b in FORMS.items()}
    for n, g in got.items():
        try:
            assert_close(g, want, dtype=torch.bfloat16, name=n)
            checks[n] = "ok"
        except AssertionError as e:
            checks[n] = f"FAILED: {str(e)[:300]}"
    checks["max_abs_cuda_vs_triton"] = float((got["cuda"].float() - got["triton"].float())
                                             .abs().max())
    res["checks"] = checks
    print(checks, flush=True)
    timed = {}
    for rnd in (1, 2):
        for what, mk in (("layer", layer), ("experts", experts)):
            for n, b in FORMS.items():
                if checks[n] != "ok" or time.time() - t0 > budget:
                    continue
                key = f"{what}_{n}_{rnd}"
                timed[key] = round(statistics.median(
                    core.time_fn(mk(b), sets, "cuda", iters=400, graph=True)), 2)
                print(key, timed[key], flush=True)
        res["us"] = timed
        (out_dir / "s31_moe_decode.json").write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, floor {floor:.2f} us (touched {statistics.mean(touched):.1f})")
    print("| form | layer r1 | layer r2 | experts r1 | experts r2 |")  # noqa
    print("|---|---|---|---|---|")
    for n in FORMS:
        print(f"| {n} | " + " | ".join(str(timed.get(f"{w}_{n}_{r}", "-"))
                                      for w in ("layer", "experts") for r in (1, 2)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
