"""Host time of the paged extend plan on the GPU (issue 20's later turn: one request, 800 new
tokens over a 50-54k cached prefix, Llama-3-8B heads: 32 q / 8 KV, head dim 128, bf16, pages
of 64), built with and without the caller's host copies of qo_indptr / seq_lens.

Each build is timed on the host twice: with the stream idle, and with ~`--busy-ms` of matrix
products queued before it (as in the engine, where the plan of a step is built while the device
still runs the previous one): a plan that reads the device tensors waits for that queue, one
built from host copies does not. Under torch.cuda.set_sync_debug_mode("error") the build with
host copies must not synchronise at all.

    python benchmarks/s17_extend_plan_gpu.py [--json out.json] [--reps 20] [--busy-ms 20]
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time

import torch

import tskernels


def build(qo, pt, lens, kc, host, backend):
    return tskernels.attention.extend_plan(qo, pt, lens, num_q_heads=32, k_cache=kc,
                                           backend=backend, **host)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--busy-ms", type=float, default=20.0)
    p.add_argument("--backend", default="cuda_paged")
    a = p.parse_args()
    dev = torch.device("cuda")
    has_host = "host_qo_indptr" in inspect.signature(tskernels.attention.extend_plan).parameters
    page, new = 64, 800
    a_mat = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    a_mat @ a_mat   # (cuBLAS set up outside the timing)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a_mat @ a_mat
    torch.cuda.synchronize()
    per_mm = (time.perf_counter() - t0) / 10 * 1e3
    n_busy = max(1, round(a.busy_ms / per_mm))
    res = {"command": "python benchmarks/s17_extend_plan_gpu.py", "device":
           torch.cuda.get_device_name(), "busy_ms": n_busy * per_mm, "rows": []}
    for cached in (50000, 50800, 52000, 54000):
        L = cached + new
        pages = -(-L // page)
        kc = torch.zeros(pages + 1, page, 8, 128, device=dev, dtype=torch.bfloat16)
        pt = torch.randperm(pages, device=dev, dtype=torch.int32)[None] + 1
        lens = torch.tensor([L], dtype=torch.int32, device=dev)
        qo = torch.tensor([0, new], dtype=torch.int32, device=dev)
        host = dict(host_qo_indptr=[0, new], host_seq_lens=[L])
        build(qo, pt, lens, kc, {}, a.backend)   # compile / caches
        row = {"cached": cached}
        variants = [("device_read", {}), ("host_copies", host)][:1 + has_host]
        for name, h in variants:
            for busy in (False, True):
                times = []
                for _ in range(a.reps):
                    torch.cuda.synchronize()
                    if busy:
                        for _ in range(n_busy):
                            a_mat @ a_mat
                    t0 = time.perf_counter()
                    plan = build(qo, pt, lens, kc, h, a.backend)
                    times.append((time.perf_counter() - t0) * 1e3)
                row[f"{name}_{'busy' if busy else 'idle'}_ms"] = statistics.median(times)
            row[f"{name}_splits"] = getattr(plan, "splits", None)
        torch.cuda.synchronize()
        if not has_host:   # (a tree before the host copies: device reads only)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            continue
        torch.cuda.set_sync_debug_mode("error")
        try:
            build(qo, pt, lens, kc, host, a.backend)
            row["host_copies_sync_free"] = True
        except RuntimeError as e:
            row["host_copies_sync_free"] = f"no: {e}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
