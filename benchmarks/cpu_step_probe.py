"""Where a CPU decode step of the default model goes (fp32), and the CPU decode attention
kernel next to the torch path it replaced.

    python benchmarks/cpu_step_probe.py

1. attention.decode "torch_cpu" on 1 and 8 requests x 60 tokens (9 query / 3 KV heads, d64,
   page 16): the fp32 C++ kernel vs the torch gather + SDPA path, µs per call.
2. Engine decode steps at batch 1 and 8 (46-token prompt): median wall ms per step and the
   share inside the GEMMs (cpu_stream), the norms and RoPE (cpu_native).
"""
from __future__ import annotations

import statistics
import time

import torch


def attention_probe() -> None:
    import tskernels
    from tskernels.ops.attention import torch_cpu
    from tskernels.testing.problems import paged_kv

    for batch in (1, 8):
        kv = paged_kv([60] * batch, 16, 3, 64, dtype=torch.float32)
        q = torch.randn(batch, 9, 64)
        res = {}
        native = torch_cpu._cpu
        for name, lib in (("C++", native), ("torch", None)):
            torch_cpu._cpu = lib
            try:
                plan = tskernels.attention.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=9,
                                                       k_cache=kv.k_cache, q_dtype=q.dtype,
                                                       backend=torch_cpu.BACKEND)
                for _ in range(20):
                    plan.run(q, kv.k_cache, kv.v_cache)
                best = float("inf")
                for _ in range(5):
                    t = time.perf_counter()
                    for _ in range(100):
                        plan.run(q, kv.k_cache, kv.v_cache)
                    best = min(best, (time.perf_counter() - t) / 100)
                res[name] = best * 1e6
            finally:
                torch_cpu._cpu = native
        print(f"decode attention, {batch} x 60 tokens: C++ {res['C++']:.1f} us, torch path "
              f"{res['torch']:.1f} us per call")


def step_probe() -> None:
    from serve.engine import Engine, SamplingParams
    from tskernels.ops.norm import cpu_native as norm_native
    from tskernels.ops.rope import cpu_native as rope_native
    from tskernels.ops.gemm import cpu_stream

    engine = Engine("default", dtype="float32", device="cpu", enable_prefix_caching=False)
    spent = {"gemm": 0.0, "norm": 0.0, "rope": 0.0}

    def timed(key, fn):
        def wrapper(*a):
            t = time.perf_counter()
            out = fn(*a)
            spent[key] += time.perf_counter() - t
            return out
        return wrapper

    cpu_stream._small_mm = timed("gemm", cpu_stream._small_mm)
    norm_native._norm = timed("norm", norm_native._norm)
    rope_native._rope_one = timed("rope", rope_native._rope_one)
    prompt = list(range(100, 146))
    for batch in (1, 8):
        for i in range(batch):
            engine.add_request(f"b{batch}-{i}", prompt,
                               SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        for _ in range(5):
            engine.step()
        steps = []
        for key in spent:
            spent[key] = 0.0
        for _ in range(20):
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
        share = ", ".join(f"{k} {v / 20 * 1e3:.1f} ms" for k, v in spent.items())
        print(f"batch {batch}: {statistics.median(steps) * 1e3:.1f} ms/step (median); "
              f"mean per step: {share}")
        while engine.has_unfinished():
            engine.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    attention_probe()
    step_probe()
