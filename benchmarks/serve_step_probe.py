"""Where a decode step's wall time goes on the GPU: host segments (scheduler plan, graph upload +
launch, waiting for the tokens, scheduler advance + outputs) against the GPU time of the step
(CUDA events around everything the step enqueues), batch 1 by default.

    python benchmarks/serve_step_probe.py [--model dummy:llama-3-8b] [--batch 1] [--json F]

The host segments are wall-clock (perf_counter) around the engine's own calls, wrapped in place;
"gpu busy" is event time from before the input upload to after the greedy ids are copied back.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from serve.engine import Engine, SamplingParams

    engine = Engine(a.model, device="cuda", dtype="bfloat16", max_num_seqs=max(a.batch, 1),
                    max_model_len=1024, num_kv_pages=4096)
    graphs = engine.runner.graphs
    assert graphs is not None, "needs CUDA graphs"
    seg = {k: [] for k in ("plan", "upload+launch", "wait ids", "advance+outputs", "step",
                           "gpu busy")}
    sched, runner = engine.scheduler, engine.runner
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    marks = {}

    def timed(name, fn):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            marks[name] = marks.get(name, 0.0) + time.perf_counter() - t
            return out
        return wrapper

    orig_run, orig_fetch = graphs.run, graphs.fetch_ids

    def run(plan):
        ev0.record()
        return orig_run(plan)

    def fetch(ids):
        out = orig_fetch(ids)
        ev1.record()
        return out

    graphs.run = timed("upload+launch", run)
    graphs.fetch_ids = timed("wait ids", fetch)
    class Timed:  # the engine's scheduler with its two per-step calls timed
        next_plan = staticmethod(timed("plan", sched.next_plan))
        advance = staticmethod(timed("advance", sched.advance))

        def __getattr__(self, name):
            return getattr(sched, name)

    engine.scheduler = Timed()
    p = SamplingParams(max_tokens=a.steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(a.batch):
        engine.add_request(f"p{i}", list(range(10 + i, 138 + i)), p)
    n = 0
    while engine.has_unfinished():
        marks.clear()
        t = time.perf_counter()
        outs = engine.step()
        wall = time.perf_counter() - t
        if "wait ids" not in marks or n < 4:
            n += 1
            continue
        torch.cuda.synchronize()
        seg["plan"].append(marks["plan"] * 1e3)
        seg["upload+launch"].append(marks["upload+launch"] * 1e3)
        seg["wait ids"].append(marks["wait ids"] * 1e3)
        seg["advance+outputs"].append((wall - marks["plan"] - marks["upload+launch"]
                                       - marks["wait ids"]) * 1e3)
        seg["step"].append(wall * 1e3)
        seg["gpu busy"].append(ev0.elapsed_time(ev1))
        n += 1
    med = {k: statistics.median(v) for k, v in seg.items() if v}
    med["host gap (step - gpu busy)"] = med["step"] - med["gpu busy"]
    for k, v in med.items():
        print(f"  {k:28s} {v:7.3f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=a.model, batch=a.batch, steps=len(seg["step"]),
                           median_ms=med), f, indent=2)


if __name__ == "__main__":
    main()
