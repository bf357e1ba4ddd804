"""Host cost of constrained decoding per engine step: llguidance bitmask fill (JSON schema,
mid-object state) for B constrained rows, and applying the mask to [B, V] logits, on the CPU
(or the device given), with the SmolLM2 tokenizer (V = 49152).

    python benchmarks/constrained_overhead.py [--device cpu|cuda] [--rows 1 8 32]

Prints one JSON line per batch size: median microseconds over `--iters` steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoTokenizer

from serve.constrained import GrammarTokenizer, apply_token_bitmask, json_schema_grammar
from serve.default_model import smollm2_dir

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "tags"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    hf = AutoTokenizer.from_pretrained(smollm2_dir())
    t0 = time.perf_counter()
    gt = GrammarTokenizer(hf, 49152, [hf.eos_token_id])
    build_s = time.perf_counter() - t0
    grammar = json_schema_grammar(SCHEMA)
    prefix = hf.encode('{"name": "Ada Lovelace", "age": 36, "tags": ["math', add_special_tokens=False)
    for rows in a.rows:
        t0 = time.perf_counter()
        matchers = [gt.matcher(grammar) for _ in range(rows)]
        compile_us = (time.perf_counter() - t0) / rows * 1e6
        for m in matchers:
            for t in prefix:
                assert m.consume(t)
        logits = torch.randn(rows, 49152, device=a.device)
        fill, apply = [], []
        for _ in range(a.iters + 5):
            t0 = time.perf_counter()
            mask = gt.fill_bitmask(matchers)
            t1 = time.perf_counter()
            out = apply_token_bitmask(logits, mask)
            if out.device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            fill.append((t1 - t0) * 1e6)
            apply.append((t2 - t1) * 1e6)
        print(json.dumps({"device": a.device, "rows": rows, "tokenizer_build_s": round(build_s, 2),
                          "matcher_create_us": round(compile_us),
                          "fill_bitmask_us": round(statistics.median(fill[5:])),
                          "apply_mask_us": round(statistics.median(apply[5:]))}))


if __name__ == "__main__":
    main()
