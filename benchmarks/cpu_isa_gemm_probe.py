"""The C++ decode-row GEMM (tskernels._cpu) per SIMD path vs its portable loop, torch.mm and
torch's packed weight-only int8 op, on SmolLM2-135M shapes (microseconds, min / median).

    python benchmarks/cpu_isa_gemm_probe.py [--threads 1]

TSKERNELS_CPU_ISA is switched per row (avx512 / avx2 / scalar), so on an AVX-512 machine the
AVX2 rows run the AVX2+FMA code path (the ISA is emulated by capping, the memory system is
this machine's).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def timeit(fn, reps=15, inner=10):
    fn()
    s = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t) / inner * 1e6)
    return min(s), statistics.median(s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    from tskernels import _cpu

    torch.set_num_threads(a.threads)
    paths = {"avx512": ["avx512", "avx2"], "avx2": ["avx2"]}.get(_cpu.detected_isa(), [])
    paths += ["neon"] if _cpu.detected_isa() == "neon" else []
    for m, n, k in [(1, 3072, 576), (8, 3072, 576), (1, 576, 1536), (8, 576, 1536)]:
        x, w = torch.randn(m, k), torch.randn(n, k)
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        sc = torch.rand(n)
        c = torch.empty(m, n)
        r = {}
        for isa in paths + ["scalar"]:
            os.environ["TSKERNELS_CPU_ISA"] = isa
            reps = (3, 2) if isa == "scalar" else (15, 10)
            r[f"{isa} fp32"] = timeit(lambda: _cpu.gemm_f32(x.data_ptr(), w.data_ptr(),
                                                            c.data_ptr(), m, n, k, k, k, n),
                                      *reps)
            if isa != "scalar":
                r[f"{isa} int8"] = timeit(lambda: _cpu.gemm_i8w(
                    x.data_ptr(), q.data_ptr(), sc.data_ptr(), c.data_ptr(), m, n, k, k, k, n))
        os.environ.pop("TSKERNELS_CPU_ISA")
        r["torch.mm fp32"] = timeit(lambda: torch.mm(x, w.t()))
        r["aten._weight_int8pack_mm"] = timeit(
            lambda: torch.ops.aten._weight_int8pack_mm(x, q, sc), 5, 2)
        print(f"M={m} N={n} K={k}: " + ", ".join(f"{k_} {v[0]:.0f}/{v[1]:.0f}"
                                                  for k_, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
