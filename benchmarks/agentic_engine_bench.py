"""In-process measurements behind issue 20's H200 targets (no HTTP in the way):

1. conc 1: a first turn of `--context` tokens, then later turns of `--new` tokens on top of the
   cached conversation: TTFT (first token out of Engine.step), prefix hit, and the same-length
   prompt uncached (what the cache-off ablation pays); decode ITL at B=1 on that context vs the
   HBM speed of light (weights + KV read once per step);
2. B = `--gap-batch` short requests decoding: the step timeline's GPU gap between decode-graph
   replays and the host preparation time, with overlap scheduling on and off, and on with
   seeded sampling inside the graphs, and with lookahead launches (the next decode step
   launched before the current one's ids are back; the scheduler reserves each row's next KV
   page one step early): lookahead steps adopted / dropped and reservations are recorded.

    python benchmarks/agentic_engine_bench.py --model dummy:benchmarks/configs/llama-3-8b-64k.json \\
        --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from serve.engine import Engine, SamplingParams

HBM_TBPS = 4.8   # H200 HBM3e peak (spec); the measured copy roofline is ~4.3 TB/s (shared/H200.md)


def _tokens(rng, n, vocab):
    return rng.integers(10, vocab - 10, n).tolist()


def _run_one(eng: Engine, rid: str, prompt, max_tokens: int, **sp):
    """(ttft_s, [token times], output ids, cached_tokens, add_request s) of one request run
    alone. The TTFT's clock starts before add_request (the prompt check and the scheduler's
    submit are in it; ttft_profile_probe.py starts after it)."""
    t0 = time.perf_counter()
    eng.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sp))
    added = time.perf_counter() - t0
    times, ids, cached = [], [], 0
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid and o.new_token_ids:
                times.append(time.perf_counter())
                ids += o.new_token_ids
                cached = o.cached_tokens
    return times[0] - t0, times, ids, cached, added


def _itl(times):
    d = np.diff(np.asarray(times)) * 1e3
    return {"p50_ms": float(np.median(d)), "mean_ms": float(d.mean()),
            "p90_ms": float(np.percentile(d, 90)), "n": int(len(d))} if len(d) else {}


def _weight_bytes(model) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers()
                 if b.dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8))
    emb = getattr(model, "embed_tokens", None)
    if emb is not None and not getattr(model, "tie", False):
        total -= emb.weight.numel() * emb.weight.element_size()   # one row is read, not all
    return int(total)


def conc1(eng: Engine, args, rng) -> dict:
    vocab = int(eng.hf_config.vocab_size)
    a = _tokens(rng, args.context, vocab)
    t1, times1, out1, _, _ = _run_one(eng, "turn0", a, args.output)
    turns, history = [], a + out1
    for t in range(args.later_turns):
        prompt = history + _tokens(rng, args.new, vocab)
        ttft, times, out, cached, added = _run_one(eng, f"turn{t + 1}", prompt, args.output)
        # computed: the tokens the turn's prefill ran (new ones + the uncached tail of the last
        # page); add_request_ms: the part of the TTFT before the engine's first step
        turns.append({"prompt_tokens": len(prompt), "reusable": len(history), "cached": cached,
                      "computed": len(prompt) - cached, "ttft_ms": ttft * 1e3,
                      "add_request_ms": added * 1e3, "itl": _itl(times)})
        history = prompt + out
    fresh = _tokens(rng, turns[-1]["prompt_tokens"], vocab)   # same length, nothing cached
    ttft_cold, _, _, cached_cold, _ = _run_one(eng, "cold", fresh, 2)
    pool = eng.runner.pool
    kv_bytes = pool.bytes_per_token(eng.runner.spec, pool.dtype) * turns[-1]["prompt_tokens"]
    wbytes = _weight_bytes(eng.model)
    sol_ms = (wbytes + kv_bytes) / (HBM_TBPS * 1e12) * 1e3
    itl = turns[-1]["itl"].get("p50_ms")
    later = [x["ttft_ms"] for x in turns]
    return {"first_turn_ttft_ms": t1 * 1e3, "first_turn_itl": _itl(times1), "later_turns": turns,
            "sampling": "temperature 1 (SamplingParams' default), ignore_eos",
            "later_ttft_ms_median": statistics.median(later),
            "later_add_request_ms_median": statistics.median(x["add_request_ms"] for x in turns),
            "prefix_hit_of_reusable": sum(x["cached"] for x in turns) / sum(x["reusable"] for x in turns),
            "uncached_same_length_ttft_ms": ttft_cold * 1e3, "uncached_cached_tokens": cached_cold,
            "ablation_ttft_ratio": ttft_cold * 1e3 / statistics.median(later),
            "weight_bytes": wbytes, "kv_bytes_per_step": int(kv_bytes),
            "sol_ms_weights_plus_kv": sol_ms,
            "sol_ms_weights_only": wbytes / (HBM_TBPS * 1e12) * 1e3,
            "itl_b1_p50_ms": itl, "itl_over_sol": itl / sol_ms if itl else None}


def gap(eng: Engine, args, rng, overlap: bool, sampled: bool, lookahead: bool = False) -> dict:
    vocab = int(eng.hf_config.vocab_size)
    # (lookahead on also makes the scheduler reserve each decode row's next page one step
    # early, so steps whose rows open a KV page can be looked ahead too)
    eng.overlap_schedule, eng.overlap_lookahead = overlap, lookahead
    sp = (dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.01) if sampled
          else dict(temperature=0.0))
    B = args.gap_batch
    for i in range(B):
        # staggered lengths: rows reach a page boundary on different steps, as in serving
        n = int(rng.integers(args.gap_prompt // 2, args.gap_prompt * 3 // 2))
        eng.add_request(f"g{i}", _tokens(rng, n, vocab),
                        SamplingParams(max_tokens=args.gap_steps + 40, ignore_eos=True,
                                       seed=i if sampled else None, **sp))
    for _ in range(30):          # prefills, then every request decoding
        eng.step()
    eng.runner.timeline.reset()
    n0, d0 = eng.num_lookahead_steps, eng.num_lookahead_dropped
    s0 = eng.scheduler.stats()
    t0 = time.perf_counter()
    n = 0
    for _ in range(args.gap_steps):
        n += len(eng.step())
    wall = time.perf_counter() - t0
    summary = eng.step_timeline()
    s1 = eng.scheduler.stats()
    ahead = {"lookahead_steps": eng.num_lookahead_steps - n0,
             "lookahead_dropped": eng.num_lookahead_dropped - d0,
             "decode_reservations": s1["decode_reservations"] - s0["decode_reservations"],
             "reservation_misses": s1["reservation_misses"] - s0["reservation_misses"]}
    for i in range(B):
        eng.abort(f"g{i}")
    while eng.has_unfinished():
        eng.step()
    by = summary["by_batch"].get(B, {})
    return {"overlap": overlap, "lookahead": lookahead, "sampled": sampled, "batch": B,
            **ahead, "steps": args.gap_steps,
            "step_ms": wall / args.gap_steps * 1e3, "tokens": n,
            "gpu_gap_us": by.get("gpu_gap_us"), "host_prep_us": by.get("host_prep_us")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=50000)
    p.add_argument("--new", type=int, default=800)
    p.add_argument("--output", type=int, default=64, help="tokens generated per turn")
    p.add_argument("--later-turns", type=int, default=2)
    p.add_argument("--gap-batch", type=int, default=64)
    p.add_argument("--gap-prompt", type=int, default=128)
    p.add_argument("--gap-steps", type=int, default=150)
    p.add_argument("--skip-conc1", action="store_true")
    p.add_argument("--gap-modes", default="overlap,plain,lookahead,sampled",
                   help="comma-separated gap runs, in order: overlap (greedy, overlap on), plain "
                        "(overlap off), lookahead (overlap + lookahead), sampled (overlap, "
                        "seeded sampling in the graphs)")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test of this script)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    max_len = args.context + args.new * (args.later_turns + 1) + args.output * 4 + 256
    eng = Engine(args.model, device=args.device, max_model_len=max_len, max_num_seqs=args.gap_batch,
                 **(dict(gpu_memory_utilization=0.9) if args.device == "cuda" else {}))
    res = {"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "command": "python benchmarks/agentic_engine_bench.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (False, None)),
           "engine_start_s": time.perf_counter() - t0, "graphs": eng.runner.graphs is not None,
           "graph_sizes": eng.runner.graphs.sizes if eng.runner.graphs else None}

    def save():
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)

    save()
    if not args.skip_conc1:
        res["conc1"] = conc1(eng, args, rng)
        save()
        c = res["conc1"]
        print(f"conc1: later-turn TTFT {c['later_ttft_ms_median']:.1f} ms (uncached "
              f"{c['uncached_same_length_ttft_ms']:.1f}, ratio {c['ablation_ttft_ratio']:.1f}x), "
              f"hit {c['prefix_hit_of_reusable']:.3f}, ITL B=1 {c['itl_b1_p50_ms']:.2f} ms = "
              f"{c['itl_over_sol']:.2f}x SoL ({c['sol_ms_weights_plus_kv']:.2f} ms)", flush=True)
    res["gap"] = []
    modes = {"overlap": (True, False, False), "plain": (False, False, False),
             "lookahead": (True, False, True), "sampled": (True, True, False)}
    for mode in args.gap_modes.split(","):
        if mode not in modes:
            p.error(f"--gap-modes: unknown mode {mode!r} (expected some of {', '.join(modes)})")
    for overlap, sampled, ahead in (modes[m] for m in args.gap_modes.split(",")):
        res["gap"].append(gap(eng, args, rng, overlap, sampled, ahead))
        save()
        g = res["gap"][-1]
        gg, hp = g["gpu_gap_us"] or {}, g["host_prep_us"] or {}
        print(f"B={g['batch']} overlap={overlap} lookahead={ahead} sampled={sampled}: step {g['step_ms']:.3f} ms, "
              f"GPU gap p50 {gg.get('p50', float('nan')):.1f} us p99 {gg.get('p99', float('nan')):.1f}, "
              f"host prep p50 {hp.get('p50', float('nan')):.1f} us, lookahead "
              f"{g['lookahead_steps']}/{g['steps']} steps ({g['lookahead_dropped']} dropped)",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
