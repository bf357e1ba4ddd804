"""numba vs the C++ intrinsics kernel (tskernels._cpu.gemm_f32 / gemm_i8w) for the decode-row
GEMM C[M, N] = A[M, K] . B[N, K]^T on SmolLM2-135M shapes, one thread, min and median of
repeats (microseconds). numba compiles for the host's SIMD through LLVM (fastmath lets it
reassociate the K sum into vector lanes).

    python benchmarks/cpu_numba_probe.py [--isa avx2]   (needs `pip install numba`)
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
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
    ap.add_argument("--isa", default=None, help="TSKERNELS_CPU_ISA for the C++ kernel")
    a = ap.parse_args()
    if a.isa:
        os.environ["TSKERNELS_CPU_ISA"] = a.isa
    import numba

    from tskernels import _cpu

    torch.set_num_threads(1)

    @numba.njit(fastmath=True, cache=False)
    def gemm_nb(x, w, c):
        m, k = x.shape
        n = w.shape[0]
        for j in range(n):
            for i in range(m):
                s = np.float32(0.0)
                for kk in range(k):
                    s += x[i, kk] * w[j, kk]
                c[i, j] = s

    @numba.njit(fastmath=True, cache=False)
    def gemm_nb_i8(x, q, sc, c):
        m, k = x.shape
        n = q.shape[0]
        for j in range(n):
            for i in range(m):
                s = np.float32(0.0)
                for kk in range(k):
                    s += x[i, kk] * np.float32(q[j, kk])
                c[i, j] = s * sc[j]

    print(f"C++ isa {_cpu.isa()}, numba {numba.__version__}; us (min / median)")
    for m, n, k in [(1, 3072, 576), (8, 3072, 576), (1, 49152, 576), (8, 49152, 576)]:
        x = np.random.randn(m, k).astype(np.float32)
        w = np.random.randn(n, k).astype(np.float32)
        q = np.random.randint(-127, 128, (n, k)).astype(np.int8)
        sc = np.random.rand(n).astype(np.float32)
        c = np.empty((m, n), np.float32)
        r = {
            "c++ f32": timeit(lambda: _cpu.gemm_f32(x.ctypes.data, w.ctypes.data, c.ctypes.data,
                                                    m, n, k, k, k, n)),
            "numba f32": timeit(lambda: gemm_nb(x, w, c)),
            "c++ int8": timeit(lambda: _cpu.gemm_i8w(x.ctypes.data, q.ctypes.data,
                                                     sc.ctypes.data, c.ctypes.data,
                                                     m, n, k, k, k, n)),
            "numba int8": timeit(lambda: gemm_nb_i8(x, q, sc, c)),
            "torch.mm f32": timeit(lambda: torch.mm(torch.from_numpy(x),
                                                    torch.from_numpy(w).t())),
        }
        print(f"M={m} N={n} K={k}: " + ", ".join(f"{k_} {v[0]:.0f}/{v[1]:.0f}"
                                                  for k_, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
