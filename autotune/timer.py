"""Timers: callables taking a zero-argument function and returning its median time in µs.
Both work where triton.testing.do_bench cannot (the interpreter, CPU-only machines)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


# why cuda_graph_timer fell back to eager timing, one entry per fallback (reported by the
# tuning scripts: a kernel that cannot be captured is timed with its launch overhead)
GRAPH_FALLBACKS: list[str] = []


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


def cuda_graph_timer(fn: Callable[[], object], *, calls: int = 20, replays: int = 5,
                     warmup: int = 3) -> float:
    """Median µs per call of `calls` launches captured into one CUDA graph and replayed
    `replays` times: the device time without the host's launch path, which dominates eager
    timings of kernels under ~100 µs (benchmarks/RESULTS.md, issue 19). Falls back to
    `cuda_timer` when `fn` cannot be captured (a host sync or a plan built per call).
    Each fallback is recorded in `GRAPH_FALLBACKS`."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):             # allocations of the first calls off the graph
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as e:  # noqa: BLE001 - not capturable: time it eagerly
        GRAPH_FALLBACKS.append(f"{type(e).__name__}: {str(e)[:160]}")
        _after_failed_capture(stream)
        return cuda_timer(fn)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    graph.reset()
    return statistics.median(times)


def _after_failed_capture(stream) -> None:
    """Undo what a capture that raised leaves behind. When the capture itself was invalidated
    (a host sync inside it), `torch.cuda.graph`'s exit raises in capture_end: the capture
    stream stays current and the default CUDA generator stays in capture mode, so every later
    `torch.randn` on the device fails ("Offset increment outside graph capture") -- seen on
    the H200 after a kernel that could not be captured."""
    import torch

    torch.cuda.set_stream(stream)
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    gen.graphsafe_set_state(gen.clone_state())   # a clone starts outside capture mode
    torch.cuda.synchronize()
