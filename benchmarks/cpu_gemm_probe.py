"""Why the CPU serving figure is where it is: SmolLM2-135M's GEMM shapes on this machine's CPU,
weights streamed from DRAM (rotating copies larger than the caches), torch.mm in both operand
orientations and tskernels' CPU weight-streaming kernel (gemm.mm "cpu_stream", fp32), against the
measured copy and read bandwidth.

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
    read = src.numel() * 4 / (_best(lambda _: src.sum(), [0]) * 1e-3) / 1e9
    print(f"threads 2, copy bandwidth {copy:.1f} GB/s (read + write), read {read:.1f} GB/s "
          "(torch.sum)")
    from tskernels.ops.gemm import cpu_stream
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8):
            for n, k in SHAPES:
                ws = [torch.randn(n, k).to(dtype) for _ in range(max(2, int(2e8 // (n * k * 4))))]
                x = torch.randn(m, k).to(dtype)
                a = _best(lambda w: torch.mm(x, w.t()), ws)
                b = _best(lambda w: torch.mm(w, x.t()).t().contiguous(), ws)
                gbps = n * k * dtype.itemsize / (min(a, b) * 1e-3) / 1e9
                line = (f"{str(dtype)[6:]:<9} M={m} N={n:<6} K={k:<5} x@W^T {a:7.3f} ms  "
                        f"(W@x^T)^T {b:7.3f} ms  torch.mm streams {gbps:5.1f} GB/s")
                if cpu_stream.available():
                    c = _best(lambda w: cpu_stream.mm(x, w), ws)
                    line += f"  | cpu_stream {c:7.3f} ms, {n * k * 4 / (c * 1e-3) / 1e9:5.1f} GB/s"
                print(line)


if __name__ == "__main__":
    main()
