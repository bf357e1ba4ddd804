"""Benchmark cases and the timing loop behind `tskernels-bench`.

A `Bench` says how to build one input set for a shape, what to run (ours and the torch
baselines), and how many bytes / FLOPs the op fundamentally moves / does. `run_bench` builds
enough input sets that together they exceed twice the L2 cache (so every timed call reads from
device memory, not cache), warms up, times each callable with CUDA events over the rotating sets
(on CPU: perf_counter), and reports medians, GB/s, TFLOP/s, the ratio to each baseline, and the
percentage of the copy bandwidth measured in the same run.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

_BENCHES: dict[str, "Bench"] = {}


@dataclass
class Bench:
    name: str
    default_shapes: list[dict]
    make: Callable[[dict, str, torch.Generator], dict]
    ours: Callable[[dict], Any]
    baselines: dict[str, Callable[[dict], Any]] = field(default_factory=dict)
    bytes: Callable[[dict], int] = lambda shape: 0
    flops: Callable[[dict], int] = lambda shape: 0
    prepare: Callable[[dict], dict] | None = None
    cpu_shapes: list[dict] | None = None  # smaller defaults when timing references on CPU


def register_bench(b: Bench) -> Bench:
    _BENCHES[b.name] = b
    return b


def benches() -> dict[str, Bench]:
    from . import cases  # noqa: F401  (registers the built-in cases)
    return dict(sorted(_BENCHES.items()))


def _input_bytes(inputs: dict) -> int:
    return sum(t.numel() * t.element_size() for t in inputs.values() if isinstance(t, torch.Tensor))


def _l2_bytes(device: str) -> int:
    if device == "cpu":
        return 32 << 20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize(device)


GRAPH_CALLS = 8  # calls captured back to back per timed graph replay (at least)


def time_fn(fn: Callable[[dict], Any], sets: list[dict], device: str, *, iters: int,
            warmup: int = 3, graph: bool = False) -> list[float]:
    """Per-call times in µs, cycling through `sets`.

    graph=True (CUDA): the calls are captured back to back into one CUDA graph, cycling
    through the sets (at least GRAPH_CALLS calls, a whole number of cycles), and each replay's
    time is divided by its number of calls. That removes launch overhead and the host latency
    of starting a replay, which otherwise enters a µs-scale kernel's time (one graph per call
    timed the same B=1 decode at 14.7-17.4 µs from run to run); each call's inputs are still
    evicted from L2 by the other sets' (callers size the sets for that)."""
    if graph and device != "cpu":
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            for inp in sets:
                fn(inp)
        torch.cuda.current_stream(device).wait_stream(s)
        per = len(sets) * max(1, -(-GRAPH_CALLS // len(sets)))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(per):
                fn(sets[i % len(sets)])
        for _ in range(warmup):
            g.replay()
        _sync(device)
        reps = max(10, -(-iters // per))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            g.replay()
            ends[i].record()
        _sync(device)
        return [s.elapsed_time(e) * 1e3 / per for s, e in zip(starts, ends)]
    call = [(lambda inp=inp: fn(inp)) for inp in sets]
    for i in range(warmup * len(call)):
        call[i % len(call)]()
    _sync(device)
    times = []
    if device == "cpu":
        for i in range(iters):
            t0 = time.perf_counter()
            call[i % len(call)]()
            times.append((time.perf_counter() - t0) * 1e6)
        return times
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call[i % len(call)]()
        ends[i].record()
    _sync(device)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + written)."""
    n = nbytes // 2 if device == "cpu" else nbytes
    n = min(n, 256 << 20) if device == "cpu" else n
    src = torch.empty(n // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = statistics.median(time_fn(lambda _: dst.copy_(src), [{}], device, iters=10 if
                                  device == "cpu" else 30))
    return 2 * n / (t * 1e-6) / 1e9


def _make(b: Bench, shape: dict, device: str, gen) -> dict:
    """b.make, with a shape lacking a key the bench needs reported by name (a ValueError with
    the bench's own shape keys as an example, not a KeyError from inside the case)."""
    try:
        return b.make(shape, device, gen)
    except KeyError as e:
        if shape is None or e.args[0] in shape:
            raise
        example = ",".join(f"{k}={v}" for k, v in b.default_shapes[0].items())
        raise ValueError(f"{b.name}: shape {shape} lacks {e.args[0]!r} (this bench's shapes "
                         f"look like --shapes '{example}')") from None


def run_bench(name: str, shapes: list[dict] | None = None, *, device: str | None = None,
              iters: int | None = None, graph: bool = False, baselines: list[str] | None = None,
              roofline_gbps: float | None = None, backend: str | None = None) -> dict:
    """Time `name` over `shapes`; returns a JSON-ready dict (one row per shape). backend: run
    "ours" under `use_backend(backend)` (default: whatever the registry selects)."""
    if backend is not None:
        from ..config import use_backend
        with use_backend(backend):
            res = run_bench(name, shapes, device=device, iters=iters, graph=graph,
                            baselines=baselines, roofline_gbps=roofline_gbps)
        res["backend"] = backend
        return res
    b = benches()[name]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    shapes = shapes or (b.cpu_shapes if device == "cpu" and b.cpu_shapes else b.default_shapes)
    iters = iters or (10 if device == "cpu" else 100)
    roof = roofline_gbps or copy_bandwidth(device)
    rows = []
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(0)
        first = _make(b, shape, device, gen)
        per_set = max(_input_bytes(first), 1)
        n_sets = 1 if device == "cpu" else int(min(max(2 * _l2_bytes(device) // per_set + 1, 2),
                                                   max(1, (8 << 30) // per_set), 64))
        sets = [first] + [b.make(shape, device, gen) for _ in range(n_sets - 1)]
        if b.prepare is not None:
            sets = [b.prepare(s) for s in sets]
        row = {"shape": shape, "input_sets": n_sets, "bytes": b.bytes(shape),
               "flops": b.flops(shape)}
        # a prepared set may name baselines that cannot run here (`_skip`) and the backend
        # `ours` ran (`_ran`); the table says which
        skip = sets[0].get("_skip", ()) if isinstance(sets[0], dict) else ()
        if isinstance(sets[0], dict) and "_ran" in sets[0]:
            row["ours_backend"] = sets[0]["_ran"]
        fns = {"ours": b.ours, **{k: f for k, f in b.baselines.items()
                                  if (baselines is None or k in baselines) and k not in skip}}
        for label, fn in fns.items():
            try:
                us = statistics.median(time_fn(fn, sets, device, iters=iters, graph=graph))
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this shape
                if label == "ours":
                    raise
                # (cuBLAS's block-scaled fp8 refuses M = 1 / 16 on torch 2.11): the row keeps
                # ours and the other baselines, and says why this one is missing
                row[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                if device != "cpu":
                    torch.cuda.synchronize(device)
                continue
            row[label] = {"us": round(us, 3),
                          "GB/s": round(row["bytes"] / (us * 1e-6) / 1e9, 1) if row["bytes"] else None,
                          "TFLOP/s": round(row["flops"] / (us * 1e-6) / 1e12, 2) if row["flops"] else None}
        ours = row["ours"]["us"]
        for label in fns:
            if label != "ours" and "us" in row[label]:
                row[label]["speedup_of_ours"] = round(row[label]["us"] / ours, 3)
        if row["bytes"]:
            row["ours"]["pct_of_copy_roofline"] = round(100 * row["ours"]["GB/s"] / roof, 1)
        rows.append(row)
        del sets, first
    dev_name = "cpu" if device == "cpu" else torch.cuda.get_device_name(device)
    ran = sorted({r["ours_backend"] for r in rows if "ours_backend" in r})
    return {"op": name, "backend": "selected: " + "/".join(ran) if ran else "selected",
            "device": dev_name, "torch": torch.__version__,
            "copy_roofline_GBps": round(roof, 1), "graph": graph, "iters": iters,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}
