"""Lab script: the H200 acceptance runs of issue 19 (autotuning), driven by benchmarks/autotune_gpu.sh.

    python benchmarks/autotune_gpu.py tune --json OUT.json [--budget 120]
        every kernel with a declared space on one bench shape (then its other bench shapes
        while time is left): tuned pick vs the kernel's heuristic timed in the same run
        (CUDA events, median of 3 timings, each a median of 50 calls after 5 warm-up calls,
        inputs rotated over 256 MB), entries saved to the user table, then a re-tune of the
        same bucket (`--repeat`): did the pick change, and the time difference of the picks
    python benchmarks/autotune_gpu.py engine --phase before|after --model M --capture F --json J
        start the engine (CUDA graphs), record its shape buckets into F (before), decode a
        batch and report the median step time and, for every lookup the engine made, the link
        of the fallback chain that supplied its config (explain)
    python benchmarks/autotune_gpu.py window --capture F --budget S --json J
        tune the captured buckets without an entry (autotune.window, the engine's
        --tune-window code) into the user table

The user table lives under $TSKERNELS_CACHE/autotune (the shell script points it at a fresh
directory, so "before" sees only the shipped tables).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

QWEN3 = dict(E=128, k=8, H=2048, I=768)
GDN = dict(HK=16, HV=32, K=128, V=128, dtype="bf16")
# (kernel, first bench shape, at most this many configs per bucket)
PLAN = [
    ("norm.rmsnorm.triton", {"N": 4096, "rows": 64, "dtype": "bfloat16"}, 4),
    ("activation.silu_and_mul.triton", {"I": 14336, "rows": 64, "dtype": "bfloat16"}, 4),
    ("rope.apply_rope.triton", {"T": 64, "H": 32, "D": 128, "dtype": "bfloat16"}, 4),
    ("attention.decode.triton", {"d": 128, "kv": "bf16", "g": 4, "bh": 512, "L": 4096}, 4),
    ("attention.extend.triton", {"d": 128, "g": 4, "q": "bf16", "kv": "bf16", "causal": 1,
                                 "N": 4096, "P": 0}, 3),
    ("attention.merge_states.triton", {"N": 4096, "H": 32, "D": 128, "dtype": "bf16"}, 3),
    ("attention.store_kv.triton", {"T": 64, "H": 8, "D": 128, "kv": "bf16", "dtype": "bf16"}, 4),
    ("mla.decode.triton", {"H": 128, "kv": "bf16", "B": 64, "L": 4096}, 3),
    ("mla.extend.triton", {"H": 128, "kv": "bf16", "B": 1, "L": 4096, "T": 1024}, 2),
    ("gemm.mm.triton", {"M": 4096, "N": 6144, "K": 4096, "dtype": "bf16"}, 3),
    ("gemm.gemv.triton", {"M": 1, "N": 6144, "K": 4096, "dtype": "bf16"}, 4),
    ("gemm.fp8_block_mm.triton", {"M": 4096, "N": 7168, "K": 2048}, 2),
    ("gemm.fp8_stream.triton", {"M": 1, "N": 7168, "K": 2048}, 3),
    ("moe.fused_experts.triton", dict(QWEN3, T=1024, w="bf16"), 2),
    ("sampling.greedy.triton", {"B": 64, "V": 128256, "dtype": "bf16"}, 4),
    ("gdn.decode_step.triton", dict(GDN, B=64), 4),
    ("gdn.chunk_prefill.triton", dict(GDN, T=4096, N=1), 2),
]


TIMER = "eager"   # --timer


def _dump(path: str, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, default=str) + "\n")


def _tune_one(ks, problem, limit, target, user, rows, device="cuda"):
    from autotune import cpu_timer, cuda_graph_timer, cuda_timer, repeat_report, tune_bucket
    from autotune.tune import _entry
    timer = (cuda_graph_timer if TIMER == "graph" else cuda_timer) if device == "cuda" else \
        (lambda fn: cpu_timer(fn, warmup=0, iters=1))
    from autotune.timer import GRAPH_FALLBACKS
    t0 = time.monotonic()
    n_fall = len(GRAPH_FALLBACKS)
    row = {"kernel": ks.kernel, "problem": problem, "limit": limit}
    try:
        runner = ks.runner(problem, device)
        first = tune_bucket(ks, problem, runner, timer=timer, target=target,
                            repeats=3 if device == "cuda" else 1, limit=limit)
        user.put(_entry(first, ks, "benchmarks/results/h200/autotune_tune.json"))
        user.save()
        again = tune_bucket(ks, problem, runner, timer=timer, target=target,
                            repeats=3 if device == "cuda" else 1, limit=limit)
        rep = repeat_report(ks, {first.bucket: first.pick}, [again])
        row.update(first.as_dict())
        row["speedup_vs_heuristic"] = (round(first.heuristic_us / first.us, 3)
                                       if first.heuristic_us else None)
        row["repeat"] = {"pick": again.pick, "us": round(again.us, 3),
                         "ties": again.ties, **rep.as_dict()}
    except Exception as e:  # noqa: BLE001 - one kernel failing must not hide the others
        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    row["seconds"] = round(time.monotonic() - t0, 1)
    if len(GRAPH_FALLBACKS) > n_fall:   # timed eagerly: not capturable in a CUDA graph
        row["graph_fallbacks"] = len(GRAPH_FALLBACKS) - n_fall
        row["graph_fallback_first"] = GRAPH_FALLBACKS[n_fall]
    rows.append(row)
    if device == "cuda":
        torch.cuda.empty_cache()
    h = row.get("heuristic_us")
    print(f"{ks.kernel} [{row.get('bucket', '?')}] tuned {row.get('us')} us "
          f"(heuristic {h} us) pick {row.get('pick')} repeat changed "
          f"{len(row.get('repeat', {}).get('changed', [])) if 'repeat' in row else '-'} "
          f"{row.get('error', '')} {row['seconds']} s", flush=True)


def cmd_tune(a) -> None:
    import tskernels.ops  # noqa: F401
    from autotune import Tables, Target, bucket_str, spaces
    from autotune.cache import device_key
    from autotune.timer import GRAPH_FALLBACKS
    target = Target.for_arch("sm_90")
    tables = Tables()
    cuda = a.device == "cuda"
    name = device_key("cuda") if cuda else "cpu"
    user = tables.table(tables.user, name)
    rows: list[dict] = []
    start = time.monotonic()
    out = {"device": name, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
           "rows": rows, "date": time.strftime("%Y-%m-%d"),
           "timer": f"autotune.{'cuda_graph_timer' if TIMER == 'graph' else 'cuda_timer'}, 3 repeats",
           "graph_timer_fallbacks": GRAPH_FALLBACKS}
    done = set()
    plan = PLAN if not a.smoke else [  # a CPU dry run: tiny problems, two configs
        (k, {n: (min(v, 64) if isinstance(v, int) else v)
             for n, v in spaces()[k].example.items()}, 2) for k, _, _ in PLAN]
    if a.smoke:
        for _, p, _ in plan:
            p.update({k: "float32" if v == "bfloat16" else "fp32" if v == "bf16" and k != "kv"
                      and k != "w" and k != "q" else v for k, v in p.items()})
    if a.only:   # kernels whose name starts with one of these prefixes
        keep = tuple(a.only.split(","))
        plan = [row for row in plan if row[0].startswith(keep)]
    for kernel, problem, limit in plan:
        if time.monotonic() - start > a.budget:
            rows.append({"kernel": kernel, "problem": problem, "error": "skipped: out of time"})
            continue
        ks = spaces()[kernel]
        _tune_one(ks, problem, limit, target, user, rows, a.device)
        done.add((kernel, bucket_str(ks.bucket(problem))))
        _dump(a.json, out)
    for kernel, _, limit in plan if not a.smoke else []:   # other bench shapes, time allowing
        ks = spaces()[kernel]
        for p in ks.shapes:
            if (kernel, bucket_str(ks.bucket(p))) in done:
                continue
            if time.monotonic() - start > a.budget:
                break
            _tune_one(ks, dict(p), limit, target, user, rows)
            done.add((kernel, bucket_str(ks.bucket(p))))
            _dump(a.json, out)
    out["seconds"] = round(time.monotonic() - start, 1)
    _dump(a.json, out)


def _engine_choices():
    """Every (kernel, bucket) the engine looked up, with the link that supplied its config."""
    from autotune import default_lookup
    seen = {}
    for ch in list(default_lookup()._memo.values()):
        seen[(ch.kernel, ch.bucket)] = {"kernel": ch.kernel, "bucket": ch.bucket,
                                        "link": ch.link, "config": ch.config,
                                        "table": ch.table, "explain": ch.explain()}
    return sorted(seen.values(), key=lambda r: (r["kernel"], r["bucket"]))


def cmd_engine(a) -> None:
    from serve.engine import Engine, SamplingParams
    kw = {"capture_shapes": a.capture} if a.phase == "before" else {}
    t0 = time.monotonic()
    engine = Engine(a.model, device=a.device, dtype="bfloat16" if a.device == "cuda" else
                    "float32", max_num_seqs=a.batch, max_model_len=1024, num_kv_pages=4096, **kw)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    start_s = time.monotonic() - t0
    p = SamplingParams(max_tokens=a.steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(a.batch):
        engine.add_request(f"r{i}", list(range(10 + i, 10 + i + a.prompt)), p)
    steps = []
    n = 0
    while engine.has_unfinished():
        sync()
        t = time.perf_counter()
        engine.step()
        sync()
        if n >= 6:                              # past the prefill and the first decodes
            steps.append((time.perf_counter() - t) * 1e3)
        n += 1
    from autotune import capture
    if a.phase == "before":
        capture.flush()
    choices = _engine_choices()
    links: dict[str, int] = {}
    for c in choices:
        links[c["link"]] = links.get(c["link"], 0) + 1
    out = {"phase": a.phase, "model": a.model, "batch": a.batch, "prompt": a.prompt,
           "engine_start_s": round(start_s, 1), "graphs": engine.runner.graphs is not None,
           "decode_steps": len(steps),
           "decode_step_ms_median": round(statistics.median(steps), 3) if steps else None,
           "decode_step_ms_p10_p90": ([round(x, 3) for x in statistics.quantiles(steps, n=10)[::8]]
                                      if len(steps) >= 10 else None),
           "links": links, "choices": choices, "date": time.strftime("%Y-%m-%d")}
    _dump(a.json, out)
    print(f"engine {a.phase}: decode step median {out['decode_step_ms_median']} ms over "
          f"{len(steps)} steps (B={a.batch}); lookups by link {links}", flush=True)


def cmd_window(a) -> None:
    import tskernels.ops  # noqa: F401
    from autotune import Target, capture, cuda_graph_timer, cuda_timer
    from autotune.cache import device_key
    from autotune.window import tune_missing
    rows = capture.load(a.capture)
    rep = tune_missing(rows, budget_s=a.budget, device="cuda", device_name=device_key("cuda"),
                       target=Target.for_arch("sm_90"),
                       timer=cuda_graph_timer if TIMER == "graph" else cuda_timer, limit=a.limit)
    from autotune.timer import GRAPH_FALLBACKS
    _dump(a.json, {"captured_rows": rows, "tuned": rep.tuned,
                   "graph_timer_fallbacks": GRAPH_FALLBACKS, "skipped": rep.skipped,
                   "left": rep.left, "seconds": round(rep.seconds, 1),
                   "budget_s": a.budget, "limit": a.limit, "timer": TIMER, "date": time.strftime("%Y-%m-%d")})
    print(rep.summary(), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["tune", "engine", "window"])
    ap.add_argument("--json", required=True)
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--phase", choices=["before", "after"], default="before")
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--capture", default="/tmp/shapes.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script's code")
    ap.add_argument("--only", default="", help="tune: comma-separated kernel name prefixes")
    ap.add_argument("--smoke", action="store_true", help="tune: tiny problems (CPU dry run)")
    ap.add_argument("--timer", choices=["eager", "graph"], default="eager",
                    help="tune: CUDA events around eager calls, or CUDA-graph replays")
    a = ap.parse_args()
    global TIMER
    TIMER = a.timer
    {"tune": cmd_tune, "engine": cmd_engine, "window": cmd_window}[a.cmd](a)


if __name__ == "__main__":
    main()
