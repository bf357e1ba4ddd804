"""Timers: callables taking a zero-argument function and returning its median time in µs.
Both work where triton.testing.do_bench cannot (the interpreter, CPU-only machines)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def cpu_timer(fn: Callable[[], object], *, warmup: int = 2, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def cuda_timer(fn: Callable[[], object], *, warmup: int = 5, iters: int = 50) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
