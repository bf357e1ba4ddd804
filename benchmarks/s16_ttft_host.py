"""Host time of issue 20's later turn (a ~50k-token cached conversation + 800 new tokens), on
the CPU: where the time between a request entering the engine and its first token goes when the
model's own work is left out.

The engine is the one of benchmarks/agentic_engine_bench.py with a tiny Llama of the same token
structure (vocabulary 128,256, context 64k, page size 64 as on a GPU, or 16, the 2,048-token
step budget of a GPU) on the CPU, overlap scheduling on (the GPU default). The CPU extend
attention (a page gather and an [800 x 51k] mask per step, nothing like the GPU's paged kernel)
is replaced by a plan that returns zeros; everything else runs. Every stage of the turn is timed
by wrapping its function (exclusive times: a stage's time excludes the stages it calls). The
stages that are device work on a GPU (the forward, the logits, the sampling kernels, decode-graph
replays) are left out of the host total; on a GPU they are enqueued while the device runs.

Two ways of measuring a later turn, as the two GPU scripts do:
- bench (benchmarks/agentic_engine_bench.py): the clock starts before `add_request` (the prompt
  check and the scheduler's submit are in it), the request samples (temperature 1, the
  SamplingParams default), generates `--output` tokens (the step that returns the first token
  has launched the first decode step), and the conversation keeps the outputs;
- probe (benchmarks/ttft_profile_probe.py --repeat): the clock starts after `add_request`,
  greedy, one output token.

Beside them, the host arithmetic the GPU's paged extend plan (tskernels, CudaExtendPlan) does
for each turn's lengths: the split choice, the work items, the work tensor (its device upload
aside); its split count is printed too.

    python benchmarks/s16_ttft_host.py [--page-sizes 64,16] [--turns 5] [--json out.json]

Runs in ~1 min on a 2-core machine. To compare trees, run it in each (a `git archive` copy
with its own scheduler extension).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tskernels  # noqa: E402
from serve import cuda_graph, model_runner  # noqa: E402
from serve.engine import Engine, SamplingParams  # noqa: E402

TINY_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64,
                  intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=128256, rms_norm_eps=1e-5,
                  hidden_act="silu", bos_token_id=128000, eos_token_id=[128001, 128009],
                  rope_theta=500000.0, max_position_embeddings=65536,
                  tie_word_embeddings=False)
# stages that are device work on a GPU (enqueued, not waited for, in the steps that matter)
DEVICE = ("forward", "logits", "sampling", "graph replay")


class Stages:
    """Exclusive wall time per stage: wrapped functions charge their time minus the wrapped
    functions they called."""

    def __init__(self):
        self.acc: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []
        self._undo: list = []

    def wrap(self, fn, name):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                inner = self._stack.pop()
                self.acc[name] += dt - inner
                if self._stack:
                    self._stack[-1] += dt
        return timed

    def replace(self, owner, attr, value):
        """owner.attr = value until undo() (an attribute a class inherits is deleted then)."""
        own = attr in vars(owner)
        self._undo.append((owner, attr, vars(owner)[attr] if own else None, own))
        setattr(owner, attr, value)

    def patch(self, owner, attr, name):
        self.replace(owner, attr, self.wrap(getattr(owner, attr), name))

    def undo(self):
        for owner, attr, old, own in reversed(self._undo):
            if own:
                setattr(owner, attr, old)
            else:
                delattr(owner, attr)
        self._undo.clear()


class _TimedScheduler:
    """The engine's scheduler with submit / next_plan / advance timed (a nanobind object's
    methods cannot be patched)."""

    def __init__(self, inner, stages: Stages):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_timed", {
            n: stages.wrap(getattr(inner, n), f"scheduler.{n}")
            for n in ("submit", "next_plan", "advance")})

    def __getattr__(self, name):
        return self._timed.get(name) or getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


class _ZeroExtend:
    """Stands in for the CPU extend plan (see the module docstring)."""

    def run(self, q, k_cache, v_cache, *, out=None, **_):
        return torch.zeros_like(q) if out is None else out.zero_()


def instrument(eng: Engine, stages: Stages) -> None:
    from serve.engine import Engine as E
    stages.replace(tskernels.attention, "extend_plan",
                   stages.wrap(lambda *a, **k: _ZeroExtend(), "attention plans"))
    for owner, attr, name in (
            (E, "add_request", "add_request"), (E, "_check_prompt", "prompt check"),
            (E, "_launch", "engine launch"), (E, "_collect", "engine collect"),
            (E, "_outputs", "outputs"),
            (model_runner.ModelRunner, "launch", "runner launch"),
            (model_runner.ModelRunner, "step_meta", "step meta (H2D)"),
            (model_runner.ModelRunner, "attention_state", "attention plans"),
            (model_runner.ModelRunner, "_pending", "ids copy"),
            (model_runner.PendingStep, "result", "ids wait"),
            (cuda_graph.CudaGraphs, "run", "decode graph launch"),
            (tskernels.sampling, "sample", "sampling"), (tskernels.sampling, "greedy", "sampling"),
            (tskernels.CPUGraph, "replay", "graph replay")):
        stages.patch(owner, attr, name)
    if eng.runner.graphs is not None:   # CpuGraphs.sample: the eager sampler (a kernel on a GPU)
        stages.patch(type(eng.runner.graphs), "sample", "sampling")
    stages.patch(eng.model, "forward", "forward")
    stages.patch(eng.model, "compute_logits", "logits")
    eng.scheduler = _TimedScheduler(eng.scheduler, stages)


def extend_plan_host_ms(cached: int, new: int, reps: int = 5) -> tuple[float, int]:
    """(ms, splits) of the host arithmetic of the GPU's paged extend plan for one request
    (Llama-3-8B: 32 q / 8 KV heads, H200: 132 SMs), the best of `reps`."""
    from tskernels.ops.attention import cuda_extend as ce
    best, splits = float("inf"), 0
    for _ in range(reps):
        t0 = time.perf_counter()
        splits, pack, work = ce._work_items(True, *ce.resolve_defaults(True, "default", "default"),
                                            [new], [cached], 32, 4, ce.BLOCK_N, "cpu")
        torch.tensor(work, dtype=torch.int32).reshape(-1)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, splits


def _platform_h200():
    """cuda_extend asks the platform for the SM count when it chooses splits: the H200's."""
    from tskernels.ops.attention import cuda_extend as ce
    real = ce.platform_of

    class _P:
        num_sms = 132
    ce.platform_of = lambda device: _P()
    return lambda: setattr(ce, "platform_of", real)


def run_turn(eng, stages, rid, prompt, flow, output):
    """One request alone: (ttft s from the flow's clock start, stage ms at the first token,
    output ids, prompt tokens computed)."""
    bench = flow == "bench"
    sp = SamplingParams(max_tokens=output if bench else 1, ignore_eos=True,
                        **({} if bench else {"temperature": 0.0}))
    stages.acc.clear()
    t0 = time.perf_counter()
    eng.add_request(rid, prompt, sp)
    t1 = time.perf_counter()
    ttft, at_first, ids, cached = None, None, [], 0
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid and o.new_token_ids:
                if ttft is None:
                    ttft = time.perf_counter() - (t0 if bench else t1)
                    at_first = {k: v * 1e3 for k, v in stages.acc.items()}
                    cached = o.cached_tokens
                ids += o.new_token_ids
    if not bench:   # the probe's clock does not see add_request
        for k in ("add_request", "prompt check", "scheduler.submit"):
            at_first.pop(k, None)
    return ttft, at_first, ids, len(prompt) - cached, cached


def measure(page_size: int, flow: str, args, cfg_path: str) -> dict:
    eng = Engine("dummy:" + cfg_path, device="cpu", max_model_len=57344, page_size=page_size,
                 chunked_prefill_size=2048, max_num_seqs=8, overlap_schedule=True, threads=1)
    stages = Stages()
    instrument(eng, stages)
    try:
        rng = np.random.default_rng(0)
        vocab = int(eng.hf_config.vocab_size)
        toks = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
        history = toks(args.context)
        _, _, out, _, _ = run_turn(eng, stages, "first", history, flow, args.output)
        if flow == "bench":
            history = history + out
        turns = []
        for t in range(args.turns + 1):   # the first later turn warms up (not counted)
            prompt = history + toks(args.new)
            ttft, st, out, computed, cached = run_turn(eng, stages, f"t{t}", prompt, flow,
                                                       args.output)
            history = prompt + out if flow == "bench" else prompt
            if t == 0:
                continue
            device = sum(st.get(k, 0.0) for k in DEVICE)
            plan_ms, splits = extend_plan_host_ms(cached, computed)
            turns.append({"prompt": len(prompt), "cached": cached, "computed": computed,
                          "ttft_ms": ttft * 1e3, "device_like_ms": device,
                          "host_ms": ttft * 1e3 - device, "stages_ms": st,
                          "gpu_extend_plan_host_ms": plan_ms, "gpu_extend_splits": splits})
    finally:
        stages.undo()
    names = sorted({k for t in turns for k in t["stages_ms"]})
    med = {k: statistics.median(t["stages_ms"].get(k, 0.0) for t in turns) for k in names}
    return {"page_size": page_size, "flow": flow, "turns": turns,
            "host_ms_median": statistics.median(t["host_ms"] for t in turns),
            "ttft_ms_median": statistics.median(t["ttft_ms"] for t in turns),
            "gpu_extend_plan_host_ms_median": statistics.median(
                t["gpu_extend_plan_host_ms"] for t in turns),
            "stages_ms_median": dict(sorted(med.items(), key=lambda kv: -kv[1]))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--page-sizes", default="64,16")
    p.add_argument("--flows", default="bench,probe")
    p.add_argument("--context", type=int, default=50000)
    p.add_argument("--new", type=int, default=800)
    p.add_argument("--output", type=int, default=4, help="tokens per bench turn")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    restore = _platform_h200()
    res = {"command": "python benchmarks/s16_ttft_host.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "config.json")
        with open(cfg, "w") as f:
            json.dump(TINY_LLAMA, f)
        try:
            for ps in (int(x) for x in args.page_sizes.split(",")):
                for flow in args.flows.split(","):
                    t0 = time.time()
                    r = measure(ps, flow, args, cfg)
                    r["wall_s"] = round(time.time() - t0, 1)
                    res["runs"].append(r)
        finally:
            restore()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    for r in res["runs"]:
        st = ", ".join(f"{k} {v:.3f}" for k, v in r["stages_ms_median"].items()
                       if k not in DEVICE and v >= 0.005)
        comp = [t["computed"] for t in r["turns"]]
        spl = [t["gpu_extend_splits"] for t in r["turns"]]
        print(f"page {r['page_size']:3d} {r['flow']:5s}: host {r['host_ms_median']:.2f} ms per "
              f"later turn (median of {len(r['turns'])}; computed tokens {comp}); GPU extend "
              f"plan's host arithmetic {r['gpu_extend_plan_host_ms_median']:.2f} ms (not in "
              f"the host figure; H200 splits {spl})\n    stages (ms, median): {st}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
