"""Fused decode gemvs on the H200 (issue 24, Llama-3-8B B=1 decode): correctness, kernel timings
old vs new, and the serving A/B, in one device call (~120-150 s):

    source benchmarks/gpu_setup.sh && timeout 150 python benchmarks/s15_gemv_gpu.py

1. GPU tier (benchmarks/gpu_tier.py, `pytest -m gpu` over tests/kernels/test_gemv_fused.py,
   evidence for verified.json), bounded by TIER_S (40 s).
2. Kernel level in this process: CUDA-graph replays of back-to-back calls, input sets rotated
   beyond 200 MB (4x the 50 MB L2), medians; unfused (norm.rmsnorm + gemm.gemv;
   activation.silu_and_mul + gemm.gemv) vs fused (gemm.rmsnorm_gemv, gemm.silu_mul_gemv) at
   the Llama-3-8B shapes, M = 1 and 16, beside the plain gemv alone (the goal: fused ~=
   gemv_only), the fused kernel without a prologue (swapped_plain: what its mma.sync
   orientation costs by itself) and the fused ops with the early stream (fused_early,
   triton_gemv_fused.EARLY_FUSED); then a whole layer's chain of the 4 projections (qkv,
   o + residual, gate-up, down + residual; attention left out) old vs new, with the early
   streams off (default) / on for the fused ops / on for all (+ triton_gemv.EARLY_STREAM).
   µs and TB/s of weight bytes, the copy roofline measured in the same run.
3. End to end: benchmarks/serve_ab.py on dummy:llama-3-8b at B=1 through CUDA graphs, fusion
   off vs on (bound_ops.FUSE_DECODE_GEMV), each run bounded by SERVE_S (40 s). ms/step.

JSON to $OUT/s15_gemv.json (and the tier's $OUT/gpu_tier_s15_gemv.json); short table last.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
TIER_S = int(os.environ.get("TIER_S", "40"))
SERVE_S = int(os.environ.get("SERVE_S", "40"))
ROTATE_BYTES = 200 << 20
EPS = 1e-5
D, QKV, INTER = 4096, 6144, 14336


def stage_tier() -> dict:
    t = time.time()
    test = "tests/kernels/test_gemv_fused.py"
    cmd = [sys.executable, "benchmarks/gpu_tier.py",
           "--out", str(OUT / "gpu_tier_s15_gemv.json"),
           "--timeout", str(TIER_S - 4), "--pytest-arg=-n", "--pytest-arg=8",
           "--pytest-arg=-p", "--pytest-arg=no:cacheprovider",
           f"--kernel=gemm.rmsnorm_gemv.triton={test}",
           f"--kernel=gemm.silu_mul_gemv.triton={test}"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIER_S)
        tail, rc = (p.stdout + p.stderr)[-1500:], p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = f"timed out after {TIER_S} s: {str(e.stdout)[-800:]}", 124
    print(tail, flush=True)
    return dict(rc=rc, tail=tail[-600:], seconds=round(time.time() - t, 1))


def _time(fn, sets, iters=200) -> float:
    from tskernels.bench import core
    return round(statistics.median(core.time_fn(fn, sets, "cuda", iters=iters, graph=True)), 2)


def _nsets(nbytes: int) -> int:
    return max(2, -(-ROTATE_BYTES // nbytes) + 1)


def _rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()


def _with(mod, name, value, fn):
    def run(d):
        keep = getattr(mod, name)
        setattr(mod, name, value)
        try:
            return fn(d)
        finally:
            setattr(mod, name, keep)
    return run


def _single(kind: str):
    """(unfused, fused) calls of one projection: RMSNorm + gemv, or SiLU-mul + gemv + residual."""
    import tskernels
    gemm = tskernels.gemm
    if kind == "norm":
        def old(d):
            return gemm.gemv(tskernels.norm.rmsnorm(d["x"], d["nw"], EPS), d["w"])

        def new(d):
            return gemm.rmsnorm_gemv(d["x"], d["nw"], d["w"], eps=EPS, backend="triton")
        return old, new

    def old(d):
        return gemm.gemv(tskernels.activation.silu_and_mul(d["x"]), d["w"], residual=d["r"])

    def new(d):
        return gemm.silu_mul_gemv(d["x"], d["w"], residual=d["r"], backend="triton")
    return old, new


def stage_kernels(roof: float) -> dict:
    import tskernels
    from tskernels.ops.gemm import triton_gemv as tg
    from tskernels.ops.gemm import triton_gemv_fused as tf
    g = torch.Generator(device="cuda").manual_seed(0)
    gemv = tskernels.gemm.gemv
    rows = []
    for m in (1, 16):
        for name, n, k, kind in (("qkv", QKV, D, "norm"), ("gate_up", 2 * INTER, D, "norm"),
                                 ("down", D, INTER, "silu")):
            wb = n * k * 2
            sets = [dict(w=_rnd(g, n, k, scale=k ** -0.5), nw=1 + _rnd(g, k, scale=0.1),
                         x=_rnd(g, m, 2 * k if kind == "silu" else k), r=_rnd(g, m, n))
                    for _ in range(_nsets(wb))]
            old, new = _single(kind)

            def plain(d):
                return gemv(d["x"][:, :d["w"].shape[1]], d["w"])

            def swapped(d):
                out = torch.empty(d["x"].shape[0], d["w"].shape[0], dtype=torch.bfloat16,
                                  device="cuda")
                return tf.fused_stream_mm(d["x"][:, :d["w"].shape[1]], d["w"], out,
                                          prologue=tf.PRO_NONE)
            us = dict(unfused=_time(old, sets), fused=_time(new, sets),
                      gemv_only=_time(plain, sets), swapped_plain=_time(swapped, sets),
                      fused_early=_time(_with(tf, "EARLY_FUSED", True, new), sets))
            rows.append(dict(op=name, M=m, N=n, K=k, weight_MB=round(wb / 1e6, 1),
                             floor_us=round(wb / roof / 1e3, 2), us=us,
                             TBps={key: round(wb / v / 1e6, 3) for key, v in us.items()}))
            print(f"{name:8s} M={m:2d}: {us}", flush=True)
            del sets
    # the layer chain: qkv, o (+res), gate-up, down (+res). fused: as shipped (no early
    # stream); fused_early: the fused ops stream early; fused_early_all: o streams early too
    chain = []
    wbytes = (QKV * D + D * D + 2 * INTER * D + D * INTER) * 2
    for m in (1, 16):
        sets = [dict(qkv=_rnd(g, QKV, D, scale=D ** -0.5), o=_rnd(g, D, D, scale=D ** -0.5),
                     gu=_rnd(g, 2 * INTER, D, scale=D ** -0.5),
                     down=_rnd(g, D, INTER, scale=INTER ** -0.5), ln1=1 + _rnd(g, D, scale=0.1),
                     ln2=1 + _rnd(g, D, scale=0.1), attn=_rnd(g, m, D), h=_rnd(g, m, D))
                for _ in range(_nsets(wbytes))]

        def old(d):
            qkv = gemv(tskernels.norm.rmsnorm(d["h"], d["ln1"], EPS), d["qkv"])
            h = gemv(d["attn"], d["o"], residual=d["h"])
            gu = gemv(tskernels.norm.rmsnorm(h, d["ln2"], EPS), d["gu"])
            return qkv, gemv(tskernels.activation.silu_and_mul(gu), d["down"], residual=h)

        def new(d):
            qkv = tskernels.gemm.rmsnorm_gemv(d["h"], d["ln1"], d["qkv"], eps=EPS,
                                              backend="triton")
            h = gemv(d["attn"], d["o"], residual=d["h"])
            gu = tskernels.gemm.rmsnorm_gemv(h, d["ln2"], d["gu"], eps=EPS, backend="triton")
            return qkv, tskernels.gemm.silu_mul_gemv(gu, d["down"], residual=h, backend="triton")
        early = _with(tf, "EARLY_FUSED", True, new)
        us = dict(old=_time(old, sets, 100), fused=_time(new, sets, 100),
                  fused_early=_time(early, sets, 100),
                  fused_early_all=_time(_with(tg, "EARLY_STREAM", True, early), sets, 100))
        chain.append(dict(M=m, weight_MB=round(wbytes / 1e6, 1),
                          floor_us=round(wbytes / roof / 1e3, 2), us=us,
                          TBps={k: round(wbytes / v / 1e6, 3) for k, v in us.items()},
                          per_step_ms_x32={k: round(v * 32 / 1e3, 3) for k, v in us.items()}))
        print(f"layer chain M={m}: {us}", flush=True)
        del sets
    return dict(rows=rows, chain=chain)


def stage_serve() -> dict:
    runs = {"off": [], "fused": ["--set", "serve.models.bound_ops.FUSE_DECODE_GEMV=True"]}
    res = {}
    for name, sets in runs.items():
        js = OUT / f"s15_serve_llama_{name}.json"
        cmd = [sys.executable, "benchmarks/serve_ab.py", *sets, "--", "--batch", "1",
               "--new-tokens", "48", "--no-hf", "--json", str(js)]
        t = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=SERVE_S)
            log = p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            log = f"timed out after {SERVE_S} s: {str(e.stdout)[-800:]}"
        lines = [ln for ln in log.splitlines() if "ms/step" in ln or "Error" in ln
                 or "speed of light" in ln.lower()]
        print(f"serve {name}: " + " | ".join(lines[-3:]), flush=True)
        doc = json.loads(js.read_text()) if js.exists() else {}
        ms = doc.get("engine_b1", {}).get("decode_ms_per_step") if doc else None
        if ms is None:
            ms = (doc.get("rows", {}).get("engine_b1") or {}).get("decode_ms_per_step")
        res[name] = dict(ms_per_step=ms, seconds=round(time.time() - t, 1),
                         tail=log[-400:] if ms is None else "")
    return res


def main() -> int:
    from tskernels.bench import core
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    doc = dict(command="python benchmarks/s15_gemv_gpu.py",
               date=time.strftime("%Y-%m-%d %H:%M"), device=torch.cuda.get_device_name(), torch=torch.__version__)
    path = OUT / "s15_gemv.json"
    doc["tier"] = stage_tier()
    path.write_text(json.dumps(doc, indent=1))
    roof = core.copy_bandwidth("cuda")
    doc["copy_roofline_GBps"] = round(roof, 1)
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    try:
        doc["kernels"] = stage_kernels(roof)
    except Exception as e:  # keep the serving stage and the JSON
        doc["kernels"] = dict(error=repr(e)[:500])
        print(f"kernel stage failed: {e!r}", flush=True)
    torch.cuda.empty_cache()
    path.write_text(json.dumps(doc, indent=1))
    doc["serve"] = stage_serve()
    doc["seconds"] = round(time.time() - t0, 1)
    path.write_text(json.dumps(doc, indent=1))
    print("\n| what | M | old (unfused) µs | new (fused) µs | gemv alone µs | new TB/s |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for r in doc["kernels"].get("rows", []):
        print(f"| {r['op']} {r['N']}x{r['K']} | {r['M']} | {r['us']['unfused']} | "
              f"{r['us']['fused']} | {r['us']['gemv_only']} | {r['TBps']['fused']} |")
    for c in doc["kernels"].get("chain", []):
        print(f"| layer chain (fused / +early / +early all) | {c['M']} | {c['us']['old']} | "
              f"{c['us']['fused']} / {c['us']['fused_early']} / {c['us']['fused_early_all']} "
              f"| | {c['TBps']['fused']} |")
    s = doc["serve"]
    print(f"| serve dummy:llama-3-8b B=1 ms/step | 1 | {s['off']['ms_per_step']} | "
          f"{s['fused']['ms_per_step']} | | |")
    print(f"tier rc {doc['tier']['rc']}; total {doc['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
