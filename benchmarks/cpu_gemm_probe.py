"""Why the CPU serving figure is where it is: SmolLM2-135M's GEMM shapes on this machine's CPU,
weights streamed from DRAM (rotating copies larger than the caches), in both operand
orientations, against the measured copy bandwidth.

    python benchmarks/cpu_gemm_probe.py
"""
from __future__ import annotations

import time

import torch

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))  # qkv o gate_up down lm_head


def _best(f, ws, n=3):
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        for w in ws:
            f(w)
        best = min(best, (time.perf_counter() - t) / len(ws))
    return best * 1e3


def main():
    torch.set_num_threads(2)
    src = torch.randn(64 << 20)  # 256 MB
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / (_best(lambda _: dst.copy_(src), [0]) * 1e-3) / 1e9
    print(f"threads 2, copy bandwidth {copy:.1f} GB/s (read + write)")
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8):
            for n, k in SHAPES:
                ws = [torch.randn(n, k).to(dtype) for _ in range(max(2, int(2e8 // (n * k * 4))))]
                x = torch.randn(m, k).to(dtype)
                a = _best(lambda w: torch.mm(x, w.t()), ws)
                b = _best(lambda w: torch.mm(w, x.t()).t().contiguous(), ws)
                gbps = n * k * dtype.itemsize / (min(a, b) * 1e-3) / 1e9
                print(f"{str(dtype)[6:]:<9} M={m} N={n:<6} K={k:<5} x@W^T {a:7.3f} ms  "
                      f"(W@x^T)^T {b:7.3f} ms  weights streamed at {gbps:5.1f} GB/s")


if __name__ == "__main__":
    main()
