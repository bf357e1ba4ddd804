"""Where issue 20's conc-1 later turn and its long-context decode spend their time: the engine
of benchmarks/agentic_engine_bench.py runs a `--context`-token first turn, then under
torch.profiler (CUDA activity) a later turn of `--new` tokens on the cached conversation and
`--decode` decode steps at that context (overlap on, lookahead off / on); `--repeat` more later
turns unprofiled, and one under cProfile (the host functions by own time). Kernel device time
is summed per kernel name and per category (attention prefill / decode, GEMM, norm, rope,
activation, KV store, sampling, other) beside the wall times.

    python benchmarks/ttft_profile_probe.py --model dummy:benchmarks/configs/llama-3-8b-64k.json \\
        --json out.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from serve.engine import Engine, SamplingParams

CATEGORIES = (("attention prefill", ("extend", "prefill", "fmha", "flash_fwd")),
              ("attention decode", ("decode", "merge_states", "split_kv", "merge_kernel")),
              ("GEMM", ("gemm", "gemv", "_stream_kernel", "nvjet", "cutlass", "sm90_xmma", "_mm_",
                        "matmul")),
              ("norm", ("rmsnorm", "norm")), ("rope", ("rope",)),
              ("activation", ("silu", "gelu")), ("KV store", ("store_kv", "store")),
              ("sampling", ("argmax", "sample", "_gm_")))


def _category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def _profiled(fn, device):
    """(wall ms, {kernel: device ms}, {category: device ms}) of fn() under the profiler."""
    from torch.profiler import ProfilerActivity, profile
    # CUDA activity alone on the GPU (less host overhead in the profiled wall times)
    acts = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    kern, cats = {}, {}
    for e in prof.key_averages():
        t = (getattr(e, "device_time_total", 0) or 0) if device == "cuda" else e.self_cpu_time_total
        if device == "cuda" and e.device_type.name != "CUDA":
            continue
        if t <= 0:
            continue
        kern[e.key[:90]] = round(t / 1e3, 3)
        c = _category(e.key)
        cats[c] = round(cats.get(c, 0.0) + t / 1e3, 3)
    top = dict(sorted(kern.items(), key=lambda kv: -kv[1])[:25])
    return round(wall, 2), top, dict(sorted(cats.items(), key=lambda kv: -kv[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=50000)
    p.add_argument("--new", type=int, default=800)
    p.add_argument("--decode", type=int, default=24)
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-model-len", type=int, default=57344)
    p.add_argument("--page-size", type=int, default=None, help="KV page size (engine default)")
    p.add_argument("--repeat", type=int, default=4,
                   help="unprofiled later turns after the profiled one (one more under cProfile)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    eng = Engine(args.model, device=args.device, max_num_seqs=8,
                 max_model_len=args.max_model_len,
                 **({"page_size": args.page_size} if args.page_size else {}))
    rng = np.random.default_rng(0)
    vocab = int(eng.hf_config.vocab_size)
    toks = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
    out: dict = {"model": args.model, "context": args.context, "new": args.new,
                 "page_size": eng.args.page_size,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "command": "python benchmarks/ttft_profile_probe.py " + " ".join(
                     f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())}

    def run(rid, prompt, n_out):
        """(ttft s, token times, prompt tokens the turn computed); the clock starts after
        add_request (agentic_engine_bench.py's before it)."""
        eng.add_request(rid, prompt, SamplingParams(max_tokens=n_out, ignore_eos=True,
                                                    temperature=0.0))
        first, times, computed = None, [], None
        t0 = time.perf_counter()
        while eng.has_unfinished():
            for o in eng.step():
                if o.request_id == rid and o.new_token_ids:
                    times.append(time.perf_counter())
                    first = first or (times[-1] - t0)
                    computed = computed or len(prompt) - o.cached_tokens
        return first, times, computed

    history = toks(args.context)
    run("warm", history, 2)                      # the first turn: prefix cached, kernels warm
    history = history + toks(args.new)
    run("warm2", history, 2)                     # a later turn once unprofiled (JIT, plans)
    prompt = history + toks(args.new)
    res = {}
    wall, top, cats = _profiled(lambda: res.update(r=run("later", prompt, 1)), args.device)
    out["later_turn"] = {"ttft_ms": round(res["r"][0] * 1e3, 2), "computed": res["r"][2],
                         "profiled_wall_ms": wall, "kernels_ms": top, "categories_ms": cats}
    print("later turn", out["later_turn"]["ttft_ms"], "ms;", cats, flush=True)
    # unprofiled later turns (each adds --new tokens to the cached conversation), then one
    # under cProfile: where the host time between the request and its first token goes
    ttfts, computed, turn = [], [], prompt
    for i in range(args.repeat):
        turn = turn + toks(args.new)
        first, _, n = run(f"later{i}", turn, 1)
        ttfts.append(round(first * 1e3, 2))
        computed.append(n)
    import cProfile
    import pstats
    turn = turn + toks(args.new)
    prof = cProfile.Profile()
    prof.enable()
    first = run("later_cprofile", turn, 1)[0]
    prof.disable()
    st = pstats.Stats(prof)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:30]   # by own (total) time
    out["later_turn"].update(
        ttft_unprofiled_ms=ttfts, computed_unprofiled=computed, ttft_unprofiled_median_ms=float(np.median(ttfts)) if ttfts
        else None, ttft_cprofile_ms=round(first * 1e3, 2),
        host_top_tottime_ms=[(f"{k[0].rsplit('/', 2)[-1]}:{k[1]}:{k[2]}", round(v[2] * 1e3, 3),
                              round(v[3] * 1e3, 3), v[1]) for k, v in top])
    print("later turns unprofiled", ttfts, "ms; tokens computed", computed, flush=True)
    for la in (False, True):
        eng.overlap_lookahead = la
        prompt2 = prompt + toks(16)
        run(f"dwarm{la}", prompt2, 4)
        wall, top, cats = _profiled(
            lambda: res.update(d=run(f"dec{la}", prompt2 + toks(8), args.decode)), args.device)
        itl = np.diff(np.asarray(res["d"][1][2:])) * 1e3
        key = "decode_lookahead" if la else "decode"
        out[key] = {"itl_p50_ms": round(float(np.median(itl)), 3) if len(itl) else None,
                    "steps": args.decode, "profiled_wall_ms": wall, "kernels_ms": top,
                    "categories_ms": cats}
        print(key, out[key]["itl_p50_ms"], "ms/step;", cats, flush=True)
    eng.overlap_lookahead = False
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
