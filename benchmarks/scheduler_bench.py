"""Scheduler benchmark (CPU, one core).

1. Decode step cost: next_plan() + advance() with 1,024 live decoding requests whose contexts
   start at 4,096 tokens (page 16), on one pinned core. Reports the median / p90 per step. The
   plan's arrays are fetched as numpy views inside the timed region, as a model runner would.
2. Prefix sharing: 64 requests that share a 50k-token prefix; prints the pages allocated with
   the prefix cache against what they would take without it.

    python benchmarks/scheduler_bench.py [--steps 1000] [--cpu 0]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads must not share our core
import numpy as np  # noqa: E402

from scheduler import Scheduler, SchedulerConfig  # noqa: E402

PLAN_ARRAYS = ("request_ids", "input_ids", "positions", "qo_indptr", "cached_lens", "seq_lens",
               "page_table", "slot_mapping", "sample")


def bench_decode(num_requests: int, context: int, steps: int, page_size: int) -> dict:
    max_context = context + steps + 64
    pages_per_request = -(-max_context // page_size)
    s = Scheduler(SchedulerConfig(
        num_pages=int(num_requests * pages_per_request * 1.02) + 1, page_size=page_size,
        max_running=num_requests, token_budget=1 << 20, max_context=max_context,
        eos_token_ids=[2]))
    rng = np.random.default_rng(0)
    for rid in range(num_requests):  # distinct prompts: no prefix sharing in this part
        s.submit(rid, rng.integers(3, 32000, size=context, dtype=np.int32), 1 << 30)
    while True:  # prefill every prompt (untimed)
        plan = s.next_plan()
        s.advance(plan, np.full(len(plan), 7, dtype=np.int32))
        if plan.num_decode == num_requests:
            break
    assert s.num_running == num_requests and s.num_waiting == 0
    sampled = rng.integers(3, 32000, size=num_requests, dtype=np.int32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        plan = s.next_plan()
        for name in PLAN_ARRAYS:
            getattr(plan, name)
        events = s.advance(plan, sampled)
        times.append(time.perf_counter_ns() - t0)
        assert plan.num_decode == num_requests and len(events) == num_requests
    s.check_invariants()
    times_us = sorted(t / 1e3 for t in times)
    return dict(median_us=statistics.median(times_us), p90_us=times_us[int(0.9 * len(times_us))],
                min_us=times_us[0], page_table_shape=plan.page_table.shape)


def bench_shared_prefix(num_requests: int, prefix_len: int, suffix_len: int, page_size: int):
    rng = np.random.default_rng(1)
    prefix = rng.integers(3, 32000, size=prefix_len, dtype=np.int32)
    num_pages = (prefix_len // page_size) + num_requests * 8 + 64
    s = Scheduler(SchedulerConfig(num_pages=num_pages, page_size=page_size, max_running=256,
                                  token_budget=8192, max_context=prefix_len + 1024,
                                  eos_token_ids=[2]))
    for rid in range(num_requests):
        suffix = rng.integers(3, 32000, size=suffix_len, dtype=np.int32)
        s.submit(rid, np.concatenate([prefix, suffix]), 4)
    peak_used, steps = 0, 0
    while s.has_work():
        plan = s.next_plan()
        s.advance(plan, np.full(len(plan), 7, dtype=np.int32))
        peak_used = max(peak_used, s.stats()["used_pages"])
        steps += 1
    st = s.stats()
    prefix_pages = prefix_len // page_size
    per_request = -(-(prefix_len + suffix_len + 4) // page_size)
    return dict(prefix_pages=prefix_pages, cache_entries=st["cache_entries"],
                peak_used_pages=peak_used, without_sharing=num_requests * per_request,
                hit_tokens=st["prefix_hit_tokens"], deferrals=st["prefix_deferrals"],
                steps=steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: first allowed)")
    args = ap.parse_args()
    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})

    d = bench_decode(args.requests, args.context, args.steps, args.page_size)
    contexts = f"{args.context}..{args.context + args.steps}"
    print(f"decode step, {args.requests} requests, contexts {contexts} tokens, page "
          f"{args.page_size}, 1 core (cpu {cpu}), {args.steps} steps: "
          f"median {d['median_us']:.1f} us, p90 {d['p90_us']:.1f} us, min {d['min_us']:.1f} us "
          f"(page_table {d['page_table_shape'][0]}x{d['page_table_shape'][1]})")
    p = bench_shared_prefix(64, 50_000, 100, args.page_size)
    print(f"shared prefix, 64 requests x (50,000 shared + 100 own tokens), page {args.page_size}: "
          f"prefix pages {p['prefix_pages']}, cache entries {p['cache_entries']}, peak used pages "
          f"{p['peak_used_pages']} (without sharing: {p['without_sharing']}), hit tokens "
          f"{p['hit_tokens']}, deferrals {p['deferrals']}, steps {p['steps']}")


if __name__ == "__main__":
    main()
