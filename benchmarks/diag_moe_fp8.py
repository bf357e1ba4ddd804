"""Lab script: why `test_fused_experts_fp8_deepseek_like[300]` fails on the H200 (issue 24).

Rebuilds the test's problem (E=32, top-8, hidden 1024, intermediate 512, block-fp8 weights,
bf16 activations) for several T and reports, per stage, where the Triton path and the
reference part ways:
  1. activation quantization: the public op's kernel vs the reference (bytes and scales);
  2. the whole layer vs the reference run on the GPU (as the test does) and on the CPU
     (float64 math), with the tolerance the test applies;
  3. the same layer under the other fp8 tile row (T <= 16 tiles at large T and back), and
     the rows / experts where the error sits.
Prints one JSON line per T and writes them to --json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", default="1,300,3000,299,301,256,512")
    ap.add_argument("--json", default="/tmp/diag_moe_fp8.json")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run under TRITON_INTERPRET=1")
    a = ap.parse_args()
    import tskernels
    import tskernels_ref.gemm as gref
    import tskernels_ref.moe as ref
    from test_moe_experts import _fp8_weights, _problem
    from tskernels.numerics import error_stats, tolerance
    from tskernels.ops.moe import _tune
    from tskernels.ops.moe import triton_experts as te

    tol = tolerance(torch.bfloat16)
    rows = []
    dev = a.device
    for t in (int(s) for s in a.ts.split(",")):
        h, inter, e, k = 1024, 512, 32, 8
        x, w13, w2, w, ids = _problem(t, h, inter, e, k, torch.bfloat16 if dev == "cuda" else torch.float16,
                                        dev, t)
        q13, s13 = _fp8_weights(w13)
        q2, s2 = _fp8_weights(w2)
        row: dict = {"T": t}
        cfg, _ = _tune.launch(t, h, inter, e, k, True, x.device)
        row["tiles"] = str(cfg)
        # 1. activation quantization
        xq, xs = tskernels.gemm.quantize_fp8_per_token_group(x, 128)
        rq, rs = gref.quantize_fp8_per_token_group(x, 128)
        row["quant_bytes_differ"] = int((xq.view(torch.uint8) != rq.view(torch.uint8)).sum())
        row["quant_scale_max_rel"] = float(((xs.float() - rs.float()).abs()
                                            / rs.float().abs().clamp_min(1e-30)).max())
        try:
            row["quant_backend"] = tskernels.registry.explain(
                "gemm", "quantize_fp8_per_token_group", device=x.device, file=False)[:600]
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            row["quant_backend"] = f"explain failed: {exc}"
        # 2. the layer
        out = tskernels.moe.fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2,
                                          backend="triton")
        if dev == "cuda":
            torch.cuda.synchronize()
        want_gpu = ref.fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2)
        cpu = [v.cpu() for v in (x, q13, q2, w, ids, s13, s2)]
        want_cpu = ref.fused_experts(cpu[0], cpu[1], cpu[2], cpu[3], cpu[4], w13_scale=cpu[5],
                                     w2_scale=cpu[6])
        row["nan_out"] = int(torch.isnan(out).sum())
        row["nan_ref"] = int(torch.isnan(want_gpu).sum())
        for name, ref_ in (("vs_gpu_ref", want_gpu), ("vs_cpu_ref", want_cpu)):
            st = error_stats(out.cpu().double(), ref_.cpu().double())
            row[name] = {"rel_rms": st.rel_rms, "rel_max": st.rel_max,
                         "ok": st.rel_rms <= tol.rel_rms and st.rel_max <= tol.rel_max}
        st = error_stats(want_gpu.cpu().double(), want_cpu.double())
        row["gpu_ref_vs_cpu_ref"] = {"rel_rms": st.rel_rms, "rel_max": st.rel_max}
        d = (out.cpu().double() - want_cpu.double()).abs()
        bad_rows = torch.nonzero(d.amax(1) > tol.rel_max * want_cpu.double().abs().max())
        row["bad_rows"] = bad_rows.flatten()[:20].tolist()
        row["n_bad_rows"] = int(bad_rows.numel())
        if bad_rows.numel():
            r0 = int(bad_rows[0])
            row["bad_row_experts"] = ids[r0].tolist()
            row["bad_row_max_err"] = float(d[r0].max())
            row["bad_cols"] = torch.nonzero(d[r0] > tol.rel_max * want_cpu.double().abs().max()
                                            ).flatten()[:20].tolist()
        counts = torch.bincount(ids.flatten().long().clamp(0, e - 1), minlength=e)
        row["tokens_per_expert_min_max"] = [int(counts.min()), int(counts.max())]
        # 3. the other tile row
        other = te.tiles_for(1 if t > 16 else 4096, True)
        alt = te.experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, tiles=other)
        st = error_stats(alt.cpu().double(), want_cpu.double())
        row["other_tiles"] = {"tiles": str(other), "rel_rms": st.rel_rms, "rel_max": st.rel_max}
        # 4. the same layer twice: deterministic?
        again = tskernels.moe.fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2,
                                            backend="triton")
        row["repeat_equal"] = bool(torch.equal(out, again))
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    Path(a.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
