"""Lab script (issue 20, the later turn's TTFT): the CUDA paged extend's launch order
(extend_split.ITEM_ORDER: "length", longest first, vs "start", by first key tile) and split
counts, in one process each stage. (Calls 2-4 of session 19 also timed a "balanced" cut of the
blocks' key tiles at equal per-SM loads: 0.88-1.12x of the equal parts, removed since.)

Stage 1 (a child process under a timeout): one Llama-3-8B attention layer (32 q / 8 KV heads,
head dim 128, bf16, 64-slot pages, permuted page table, GQA-packed plans), CUDA-graph replay
medians over rounds (benchmarks/s15_extend_gpu.py's problem and fp32 reference): "old" =
automatic split launched longest first, "start" = the same items by first key tile, "pN" / "pNs"
= N parts forced, in either order. Shapes: the agentic later turns (50.8k + 800, 50.9k + 816, 54.3k + 848, 20k + 800), the
51k + 16 / + 128 follow-ups, a 4-request batch.
Stage 2: later turns in the engine (dummy Llama-3-8B, 64k context; a 50k-token first turn,
then later turns of 800 new tokens with ITEM_ORDER "start" / "length" in A B B A order, the
first two untimed), TTFT as benchmarks/agentic_engine_bench.py measures it (clock before
add_request, sampling at temperature 1, 64 outputs kept in the conversation).

    python benchmarks/s19_balance_gpu.py $OUT 240        # OUT, total seconds budget
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
PAGE = 64
SHAPES = [
    ("later_50.8k+800", [50800], [800]),
    ("later_50.9k+816", [50900], [816]),
    ("later_54.3k+848", [54300], [848]),
    ("later_20k+800", [20000], [800]),
    ("followup_51k+16", [51000], [16]),
    ("followup_51k+128", [51000], [128]),
    ("batch4", [50800, 51000, 30000, 8000], [800, 16, 128, 512]),
]
FORCED = (3, 5)
ROUNDS = 5
# the engine stage's A / B: extend_split.ITEM_ORDER of "on" / "off"
ENGINE_ON, ENGINE_OFF = "start", "length"


def stage1(out_dir: str, deadline: float) -> int:
    import torch

    import s15_extend_gpu as s15
    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    from tskernels.ops.shared import extend_split
    rows, path = [], os.path.join(out_dir, "s19_balance_layer.json")
    gen = torch.Generator().manual_seed(0)
    for name, prefixes, news in SHAPES:
        if time.time() > deadline - 10:
            rows.append(dict(shape=name, skipped="time budget"))
            continue
        indptr, pt, seq, data = s15._problem(prefixes, news, gen, 1, PAGE)

        def mk(s, order):
            old = extend_split.ITEM_ORDER
            extend_split.ITEM_ORDER = order
            try:
                return CudaExtendPlan(indptr, pt, seq, num_q_heads=s15.HQ, num_kv_heads=s15.HKV,
                                      head_dim=s15.D, page_size=PAGE, q_dtype=torch.bfloat16,
                                      kv_dtype=torch.bfloat16, scale=s15.D ** -0.5, paged=True,
                                      splits=s, gqa_pack=True)
            finally:
                extend_split.ITEM_ORDER = old
        plans = {"old": mk(None, "length"), "start": mk(None, "start")}
        if len(news) == 1:
            for s in FORCED:
                plans[f"p{s}"] = mk(s, "length")
                plans[f"p{s}s"] = mk(s, "start")
        flops = s15._flops(prefixes, news)
        ref = s15._reference(data[0], indptr, pt, seq, PAGE)
        row = dict(shape=name, prefixes=prefixes, new=news, page_size=PAGE,
                   gflop=round(flops / 1e9, 1), variants=_rounds(plans, data, ref, flops))
        v = row["variants"]
        if "us" in v.get("start", {}) and "us" in v.get("old", {}):
            row["speedup_start_vs_old"] = round(v["old"]["us"] / v["start"]["us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
        del data, ref, plans
        torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


def _rounds(plans, data, ref, flops, rounds=ROUNDS) -> dict:
    """Each plan's output vs the fp32 reference, then `rounds` rounds of every plan's
    graph-replay median, the plans in a rotated order each round (so drift in the GPU's speed
    over the run, e.g. after the caches' allocation, spreads over all of them); per plan the
    median and the minimum over rounds."""
    import torch

    from tskernels.bench.core import time_fn
    res, keys = {}, list(plans)
    for key, plan in plans.items():
        o = plan.run(data[0]["q"], data[0]["kc"], data[0]["vc"])
        torch.cuda.synchronize()
        res[key] = dict(splits=plan.splits, ctas=plan.num_blocks * plan.ctas_per_item,
                        max_abs_vs_fp32=float((o.float() - ref).abs().max()),
                        finite=bool(torch.isfinite(o).all()), rounds=[])
    t_end = time.time() + 0.5  # past the allocation's slow window
    while time.time() < t_end:
        plans[keys[0]].run(data[0]["q"], data[0]["kc"], data[0]["vc"], out=data[0]["out"])
        torch.cuda.synchronize()
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            us = sorted(time_fn(lambda d, p=plans[key]: p.run(d["q"], d["kc"], d["vc"],
                                                               out=d["out"]),
                                data, "cuda", iters=10, graph=True))
            res[key]["rounds"].append(round(us[len(us) // 2], 1))
    for v in res.values():
        v["us"] = statistics.median(v["rounds"])
        v["us_min"] = min(v["rounds"])
        v["tflops"] = round(flops / v["us"] / 1e6, 1)
    return res


def stage2(out_dir: str, turns: int) -> dict:
    import numpy as np

    from agentic_engine_bench import _run_one, _tokens
    from serve.engine import Engine
    from tskernels.ops.shared import extend_split
    rng = np.random.default_rng(0)
    context, new, output = 50000, 800, 64
    eng = Engine("dummy:benchmarks/configs/llama-3-8b-64k.json", device="cuda",
                 max_model_len=context + (new + output) * (turns + 3) + 256, max_num_seqs=64,
                 gpu_memory_utilization=0.9)
    vocab = int(eng.hf_config.vocab_size)
    a = _tokens(rng, context, vocab)
    _, _, out, _, _ = _run_one(eng, "turn0", a, output)
    history = a + out
    res = {"on": [], "off": []}
    for t in range(turns + 2):
        on = t % 4 in (0, 3)   # A B B A: the growing context weighs both sides alike
        extend_split.ITEM_ORDER = ENGINE_ON if on else ENGINE_OFF
        prompt = history + _tokens(rng, new, vocab)
        ttft, _, out, cached, _ = _run_one(eng, f"turn{t + 1}", prompt, output)
        history = prompt + out
        if t >= 2 and t < turns + 2:
            res["on" if on else "off"].append(dict(ttft_ms=ttft * 1e3, prompt=len(prompt),
                                                   cached=cached))
    extend_split.ITEM_ORDER = "start"
    res["on_is"], res["off_is"] = ENGINE_ON, ENGINE_OFF
    for k in ("on", "off"):
        res[f"median_{k}_ms"] = statistics.median(x["ttft_ms"] for x in res[k])
    return res


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 240.0
    if len(sys.argv) > 3 and sys.argv[3] == "--stage1":
        return stage1(out_dir, budget)
    t0 = time.time()
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               command=f"python benchmarks/s19_balance_gpu.py $OUT {budget:g}")
    left = budget * 0.45
    try:
        p = subprocess.run([sys.executable, __file__, out_dir, str(time.time() + left),
                            "--stage1"], timeout=left, capture_output=True, text=True)
        res["stage1_rc"], log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        res["stage1_rc"] = "timeout"
        log = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                      for x in (e.stdout, e.stderr))
    with open(os.path.join(out_dir, "s19_balance_layer.log"), "w") as f:
        f.write(log)
    path = os.path.join(out_dir, "s19_balance_layer.json")
    res["layer"] = json.load(open(path)) if os.path.exists(path) else []
    try:
        res["engine"] = stage2(out_dir, 14)
    except Exception as e:  # the layer rows still count
        res["engine"] = dict(error=f"{type(e).__name__}: {e}")
    res["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "s19_balance.json"), "w") as f:
        json.dump(res, f, indent=1)
    keys = ["old", "start"] + [f"p{s}{o}" for s in FORCED for o in ("", "s")]
    print(f"{'shape':<18} " + " ".join(f"{k:>13}" for k in keys) + "  max err")
    for r in res["layer"]:
        v = r.get("variants", {})
        cell = lambda k: (f"{v[k]['us']:.1f} ({v[k]['splits']})"  # noqa: E731
                          if "us" in v.get(k, {}) else "-")
        err = max((x.get("max_abs_vs_fp32") or 0) for x in v.values()) if v else "-"
        print(f"{r['shape']:<18} " + " ".join(f"{cell(k):>13}" for k in keys) + f"  {err}")
    e = res["engine"]
    if "median_on_ms" in e:
        print(f"engine later-turn TTFT median: {ENGINE_ON} {e['median_on_ms']:.2f} ms "
              f"{[round(x['ttft_ms'], 1) for x in e['on']]}, {ENGINE_OFF} "
              f"{e['median_off_ms']:.2f} ms {[round(x['ttft_ms'], 1) for x in e['off']]}")
    else:
        print("engine:", e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
