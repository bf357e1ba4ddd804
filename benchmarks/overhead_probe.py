"""Where the host time of one eager op call goes (CPU µs per call, medians of 2000 calls):
selection, argument checks, the raw Triton launch, and the whole public call.

    python benchmarks/overhead_probe.py
"""
from __future__ import annotations

import statistics
import time

import torch
import triton

import tskernels
from tskernels.ops.norm import _problem
from tskernels.ops.norm.triton import _rmsnorm_kernel
from tskernels.registry import select


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n // 5):
            fn()
        samples.append((time.perf_counter() - t0) / (n // 5) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    prob = _problem(x, w)
    rows = {
        "select()": lambda: select("norm", "rmsnorm", **prob),
        "argument checks": lambda: _problem(x, w),
        "raw triton launch": lambda: _rmsnorm_kernel[(1,)](
            x, x, w, y, y, 1, 4096, 4096, 4096, 4096, 4096, 1e-6, HAS_RES=False, BLOCK=4096,
            ROWS=1, num_warps=16),
        "tskernels.norm.rmsnorm": lambda: tskernels.norm.rmsnorm(x, w),
        "torch F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
        "torch empty_like": lambda: torch.empty_like(x),
    }
    print(f"triton {triton.__version__} torch {torch.__version__}")
    for name, fn in rows.items():
        print(f"{name:<26} {per_call_us(fn):8.1f} us/call (host)")


if __name__ == "__main__":
    main()
