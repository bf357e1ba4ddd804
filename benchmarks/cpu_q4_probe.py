"""The C++ decode-row GEMM with int8 weights vs 4-bit weights widened to float vs 4-bit weights
x int8 activation groups (gemm_q4w act_int8), SmolLM2's 3072 x 576 gate|up shape, M = 1-8.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_q4_probe.py [--threads 2]
        (TSKERNELS_CPU_ISA=avx2 for the AVX2 path)

24 different weight matrices are cycled (42 MB of int8: past this machine's L3), medians of 9
interleaved rounds, us per call.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import tskernels
from tskernels.ops.gemm import cpu_stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c_ = cpu_stream._cpu
    n, k, r = 3072, 576, 24
    ws = [torch.randn(n, k) * 0.02 for _ in range(r)]
    i8 = [tskernels.gemm.quantize_int8_per_channel(w) for w in ws]
    q4 = [tskernels.gemm.quantize_q4_groups(w) for w in ws]
    print(f"isa {c_.isa()}, {a.threads} threads, us per call (median of 9)")
    for m in (1, 2, 4, 8):
        x = torch.randn(m, k)
        c = torch.empty(m, n)

        def int8(j):
            q, s = i8[j]
            c_.gemm_i8w(x.data_ptr(), q.data_ptr(), s.data_ptr(), c.data_ptr(), m, n, k, k, k, n)

        def q4f(j, act=False):
            q, s, mn = q4[j]
            c_.gemm_q4w(x.data_ptr(), q.data_ptr(), s.data_ptr(), mn.data_ptr(), c.data_ptr(),
                        m, n, k, k, k // 2, n, act_int8=act)

        fns = {"int8": int8, "4-bit": q4f, "4-bit x int8": lambda j: q4f(j, True)}
        res = {name: [] for name in fns}
        for _ in range(9):
            for name, fn in fns.items():
                t = time.perf_counter()
                for j in range(r):
                    fn(j)
                res[name].append((time.perf_counter() - t) / r * 1e6)
        print(f"M={m}: " + ", ".join(f"{name} {statistics.median(v):.0f}"
                                     for name, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
