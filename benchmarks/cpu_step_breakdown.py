"""Where a CPU decode step of the default model goes: wall time per engine step, split into the
C++ kernels (GEMM fp32 / int8, decode attention, K/V store, RMSNorm, SiLU-and-mul, RoPE) and
everything else (the Python forward, torch's small ops, the scheduler and sampling).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_step_breakdown.py [--threads 2]
        [--quantization none int8 int4] [--batch 1 8] [--steps 30] [--json out.json]

Every call of the extension module tskernels._cpu made by the CPU backends is timed through a
wrapper (~1 us per call, included in the kernel figure); "other" = step - sum(kernels). The
count of kernel calls per step is printed too (the Python overhead scales with it).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

import torch

KERNELS = ("gemm_f32", "gemm_bf16w", "gemm_i8w", "gemm_q4w", "decode_attn_f32", "store_rows",
           "rmsnorm_f32", "silu_and_mul_f32", "rope_f32")


class _Timed:
    """Stands in for the tskernels._cpu module: the KERNELS accumulate time and calls."""

    def __init__(self, mod, spent, calls):
        self._mod, self._spent, self._calls = mod, spent, calls

    def __getattr__(self, name):
        fn = getattr(self._mod, name)
        if name not in KERNELS:
            return fn
        spent, calls = self._spent, self._calls

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
                calls[name] += 1
        return timed


def _patch(spent, calls) -> None:
    from tskernels.ops.activation import cpu_native as act
    from tskernels.ops.attention import torch_cpu
    from tskernels.ops.gemm import cpu_stream
    from tskernels.ops.norm import cpu_native as norm
    from tskernels.ops.rope import cpu_native as rope

    for m in (act, torch_cpu, cpu_stream, norm, rope):
        if m._cpu is not None and not isinstance(m._cpu, _Timed):
            m._cpu = _Timed(m._cpu, spent, calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantization", nargs="+", default=["none", "int8"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from serve.engine import Engine, SamplingParams

    spent: dict = collections.defaultdict(float)
    calls: dict = collections.defaultdict(int)
    _patch(spent, calls)
    prompt = list(range(100, 146))
    rows = []
    for quant in a.quantization:
        engine = Engine("default", dtype="float32", device="cpu", quantization=quant,
                        enable_prefix_caching=False, threads=a.threads)
        for batch in a.batch:
            for i in range(batch):
                engine.add_request(f"{quant}-{batch}-{i}", prompt, SamplingParams(
                    max_tokens=a.steps + 8, temperature=0.0, ignore_eos=True))
            for _ in range(4):  # prefill + warm decode steps
                engine.step()
            spent.clear()
            calls.clear()
            steps = []
            for _ in range(a.steps):
                t = time.perf_counter()
                engine.step()
                steps.append(time.perf_counter() - t)
            while engine.has_unfinished():
                engine.step()
            per = {k: v / a.steps * 1e3 for k, v in spent.items()}
            mean = sum(steps) / a.steps * 1e3
            row = dict(quantization=quant, batch=batch, step_ms_median=statistics.median(steps)
                       * 1e3, step_ms_mean=mean, kernel_ms=per,
                       other_ms=mean - sum(per.values()),
                       calls_per_step={k: v / a.steps for k, v in calls.items()})
            rows.append(row)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda x: -x[1]))
            print(f"{quant:5s} B={batch}: step {row['step_ms_median']:.1f} ms median "
                  f"({mean:.1f} mean) = {parts}, other {row['other_ms']:.1f} ms; "
                  f"{sum(calls.values()) / a.steps:.0f} kernel calls/step", flush=True)
        del engine
    if a.json:
        from tskernels import _cpu

        with open(a.json, "w") as f:
            json.dump(dict(threads=a.threads, isa=_cpu.isa(), load_avg=os.getloadavg(),
                           omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), rows=rows), f,
                      indent=2)


if __name__ == "__main__":
    main()
