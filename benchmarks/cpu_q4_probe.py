"""The C++ decode-row GEMMs on SmolLM2-135M's shapes, per token: 4-bit weights x int8
activations (gemm_q4w act_int8, the `--quantization int4` path) and 4-bit widened to float for
the fused q|k|v (960 x 576), o (576 x 576), gate|up (3072 x 576) and down (576 x 1536)
projections, and the int8 logits projection (49152 x 576) with float and with int8
activations, at M = 1 and 8, against a bytes roofline (weight bytes / this machine's measured
read bandwidth).

    python benchmarks/cpu_q4_probe.py [--threads 2] [--json out.json]
        (TSKERNELS_CPU_ISA=avx2 for the AVX2 path; OMP_WAIT_POLICY as the engine runs)

30 different weight matrices per projection are cycled (one per layer, as a decode step reads
them: past this machine's L3), medians of 11 interleaved rounds, us per call; "per token" sums
30 layers + the logits projection.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch

import tskernels
from tskernels.ops.gemm import cpu_stream

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
HEAD = (49152, 576)
LAYERS = 30


def read_bandwidth() -> float:
    """GB/s of torch's sum over 256 MB (fp32), best of 5: the streaming-read roofline."""
    x = torch.ones(64 * 1024 * 1024)
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c_ = cpu_stream._cpu
    bw = read_bandwidth()
    print(f"isa {c_.isa()}, {a.threads} threads, read {bw:.1f} GB/s, load {os.getloadavg()}")
    w4 = {s: [tskernels.gemm.quantize_q4_groups(torch.randn(n, k) * 0.02)
              for _ in range(LAYERS)] for s, (n, k) in SHAPES.items()}
    head = tskernels.gemm.quantize_int8_per_channel(torch.randn(*HEAD) * 0.02)
    rows = []
    for m in (1, 8):
        tot = {"4-bit x int8": 0.0, "4-bit float": 0.0}
        for name, (n, k) in SHAPES.items():
            x, c = torch.randn(m, k), torch.empty(m, n)

            def run(act, ws=w4[name], n=n, k=k, x=x, c=c):
                for q, s, mn in ws:
                    c_.gemm_q4w(x.data_ptr(), q.data_ptr(), s.data_ptr(), mn.data_ptr(),
                                c.data_ptr(), m, n, k, k, k // 2, n, act_int8=act)
            res = {True: [], False: []}
            for _ in range(11):
                for act in (True, False):
                    res[act].append(_timed(lambda: run(act)) / LAYERS * 1e6)
            us = {act: statistics.median(v) for act, v in res.items()}
            roof = n * k * 0.75 / bw / 1e3  # 4 bits + fp32 scale and min per 32 weights
            tot["4-bit x int8"] += us[True] * LAYERS
            tot["4-bit float"] += us[False] * LAYERS
            rows.append(dict(m=m, shape=name, n=n, k=k, us_q4_int8=us[True],
                             us_q4_float=us[False], us_roofline=roof))
            print(f"M={m} {name:8s} {n}x{k}: 4-bit x int8 {us[True]:6.1f} us, 4-bit float "
                  f"{us[False]:6.1f} us, roofline {roof:5.1f} us", flush=True)
        n, k = HEAD
        x, c = torch.randn(m, k), torch.empty(m, n)
        q, s = head
        res = {True: [], False: []}
        for _ in range(7):
            for act in (True, False):
                res[act].append(_timed(lambda: c_.gemm_i8w(
                    x.data_ptr(), q.data_ptr(), s.data_ptr(), c.data_ptr(), m, n, k, k, k, n,
                    act_int8=act)) * 1e6)
        us = {act: statistics.median(v) for act, v in res.items()}
        roof = n * k / bw / 1e3
        rows.append(dict(m=m, shape="lm_head", n=n, k=k, us_i8_int8=us[True],
                         us_i8_float=us[False], us_roofline=roof))
        layer_roof = sum(r["us_roofline"] for r in rows if r["m"] == m and r["shape"] in SHAPES)
        print(f"M={m} lm_head  {n}x{k} int8: int8 act {us[True]:6.0f} us, float act "
              f"{us[False]:6.0f} us, roofline {roof:5.0f} us")
        print(f"M={m} per token: 4-bit x int8 + int8 x int8 head "
              f"{(tot['4-bit x int8'] + us[True]) / 1e3:.2f} ms, 4-bit float + float head "
              f"{(tot['4-bit float'] + us[False]) / 1e3:.2f} ms, roofline "
              f"{(layer_roof * LAYERS + roof) / 1e3:.2f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="minutes"), isa=c_.isa(), threads=a.threads, read_gb_s=bw,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), load_avg=os.getloadavg(),
                rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
