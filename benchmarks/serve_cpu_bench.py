"""CPU serving figure: tokens/s of the Engine vs HF transformers `generate` on SmolLM2-135M,
same prompt, greedy, batch 1 and 8, in fp32 and in bf16 (each side in the same dtype), measured
in one run (interleaved repeats, best-of).

    python benchmarks/serve_cpu_bench.py [--new-tokens 64] [--repeats 3] [--json out.json]

Both sides generate exactly --new-tokens per sequence (the engine ignores EOS; HF gets
min_new_tokens) and time the whole call, prefill included. The engine runs with prefix caching
off so that the batch of identical prompts is not cheaper for it than for HF.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch

PROMPT = "Write a short story about a robot who learns to paint, in five sentences."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for dtype in a.dtype:
        rows += bench_dtype(a, dtype)
    meta = dict(date=datetime.date.today().isoformat(), torch=torch.__version__,
                threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
                model="SmolLM2-135M-Instruct (Q4_1 GGUF dequantized)", rows=rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(meta, f, indent=2)


def bench_dtype(a, dtype: str) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from serve.default_model import smollm2_dir
    from serve.engine import Engine, SamplingParams

    engine = Engine("default", dtype=dtype, device="cpu", enable_prefix_caching=False)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=getattr(torch, dtype)).eval()
    tok = engine.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                  add_generation_prompt=True, return_dict=True)["input_ids"]
    n = a.new_tokens
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    def run_engine(b):
        t = time.perf_counter()
        outs = engine.generate([ids] * b, params)
        dt = time.perf_counter() - t
        assert all(len(o.token_ids) == n for o in outs)
        return dt, outs[0].token_ids

    @torch.inference_mode()
    def run_hf(b):
        x = torch.tensor([ids] * b)
        t = time.perf_counter()
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
        dt = time.perf_counter() - t
        return dt, out[0, len(ids):].tolist()

    run_engine(1), run_hf(1)  # warm-up: allocator, thread pools, first-call paths
    rows = []
    for b in a.batch:
        best = {"engine": float("inf"), "hf": float("inf")}
        for _ in range(a.repeats):
            for name, fn in (("engine", run_engine), ("hf", run_hf)):
                dt, toks = fn(b)
                best[name] = min(best[name], dt)
                if name == "engine":
                    eng_toks = toks
                else:
                    same = toks == eng_toks
        row = dict(dtype=dtype, batch=b, new_tokens=n, prompt_tokens=len(ids),
                   engine_tok_s=b * n / best["engine"], hf_tok_s=b * n / best["hf"],
                   speedup=best["hf"] / best["engine"], greedy_tokens_equal=same)
        rows.append(row)
        print(f"{dtype} batch {b}: engine {row['engine_tok_s']:.1f} tok/s, HF generate "
              f"{row['hf_tok_s']:.1f} tok/s, speedup {row['speedup']:.2f}x "
              f"(greedy tokens equal: {same})", flush=True)
    return rows


if __name__ == "__main__":
    main()
