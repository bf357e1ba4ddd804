"""GPU serving figure: the Engine vs HF transformers `generate` on a dummy Llama-3-8B-shape model
(random bf16 weights), side by side in one run: decode ms/step at B=1, tokens/s at B=32 and 64.

    python benchmarks/serve_gpu_bench.py [--json benchmarks/results/h200/serve_gpu.json]
        [--profile]   # also print where a decode step's GPU time goes (torch.profiler)
    python benchmarks/serve_gpu_bench.py --device cpu --dtype float32 --model dummy:tiny-llama \
        --batch 1 4 --new-tokens 8    # smoke run without a GPU

Decode ms/step is the median wall time of steady-state decode steps (prefill excluded);
tokens/s counts generated tokens over the whole generate call, prefill included, on both sides;
both sides warm up at each batch size first (kernel compiles are not timed).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

PROMPT_LEN = 128


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def engine_figures(engine, batch: int, new_tokens: int):
    from serve.engine import SamplingParams

    g = torch.Generator().manual_seed(batch)
    vocab = min(30000, engine.hf_config.vocab_size)
    prompts = [torch.randint(10, vocab, (PROMPT_LEN,), generator=g).tolist()
               for _ in range(batch)]
    # warm-up at this batch size on other prompts of the same length (no prefix-cache hits
    # later): the prefill / decode kernels of these shapes compile here, not in the timed call
    engine.generate([torch.randint(10, vocab, (PROMPT_LEN,), generator=g).tolist()
                     for _ in range(batch)],
                    SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                   detokenize=False))
    p = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"b{batch}-{i}", ids, p)
    step_ms = []
    t0 = time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        dt = (time.perf_counter() - t) * 1e3
        if len(outs) == batch and all(o.completion_tokens > 1 for o in outs):  # pure decode
            step_ms.append(dt)
    wall = time.perf_counter() - t0
    return statistics.median(step_ms), batch * new_tokens / wall


@torch.inference_mode()
def hf_figures(model, batch: int, new_tokens: int):
    dev = next(model.parameters()).device
    x = torch.randint(10, min(30000, model.config.vocab_size), (batch, PROMPT_LEN), device=dev)
    kw = dict(do_sample=False, pad_token_id=0)
    model.generate(x[:, :8], attention_mask=torch.ones_like(x[:, :8]), max_new_tokens=2, **kw)
    _sync()
    t = time.perf_counter()
    model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, **kw)
    _sync()
    prefill = time.perf_counter() - t
    t = time.perf_counter()  # min_new_tokens: no early stop at a random EOS
    model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, **kw)
    _sync()
    wall = time.perf_counter() - t
    return (wall - prefill) / (new_tokens - 1) * 1e3, batch * new_tokens / wall


def profile_decode(engine, batch: int = 1) -> list[tuple[str, float]]:
    from serve.engine import SamplingParams

    engine.add_request("prof", list(range(10, 10 + PROMPT_LEN)),
                       SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    for _ in range(4):
        engine.step()
    acts = [torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
            else torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(4):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    cuda = torch.cuda.is_available()
    rows = sorted(((e.key, (e.device_time_total if cuda else e.self_cpu_time_total) / 4e3)
                   for e in prof.key_averages()),
                  key=lambda r: -r[1])
    return rows[:25]


def active_weight_bytes(model, cfg) -> int:
    """Weight bytes one decode token reads: every parameter, buffer and tensor attribute (packed
    / quantized weights and their scales) except an untied embedding table (a row gather), stacked experts
    (`layers.Experts`) at top_k / E of their size. RoPE tables count too (a small excess)."""
    import serve.models.layers as layers
    k = getattr(cfg, "num_experts_per_tok", None)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    seen, total = set(), 0
    for name, mod in model.named_modules():
        own = [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]
        for v in vars(mod).values():   # packed weights / scales kept as plain attributes
            for t in (v if isinstance(v, tuple) else (v,)):
                if isinstance(t, torch.Tensor):
                    own.append(t)
        if name.endswith("embed_tokens") and not tied:
            seen.update(id(p) for p in own)
            continue
        frac = k / mod.num_experts if isinstance(mod, layers.Experts) and k else 1.0
        for p in own:
            if id(p) not in seen:
                seen.add(id(p))
                total += int(p.numel() * p.element_size() * frac)
    return total


def measure_bandwidth(device="cuda", nbytes=4 << 30) -> float:
    """Device copy bandwidth (read + write bytes / s), median of 10 copies of `nbytes`."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def _hf_config_dict(model: str) -> dict:
    """The HF config of a dummy model: a named entry, or a JSON file (dummy:path.json)."""
    from serve.config import DUMMY_CONFIGS
    name = model.removeprefix("dummy:")
    if name.endswith(".json"):
        with open(name) as f:
            return json.load(f)
    return dict(DUMMY_CONFIGS[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-graphs", action="store_true", help="decode eagerly")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 64])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    ap.add_argument("--num-kv-pages", type=int, default=8192,
                    help="KV pages to allocate (fewer lets a 61 GB model fit an 80 GB card)")
    a = ap.parse_args()

    from serve.engine import Engine

    t = time.perf_counter()
    engine = Engine(a.model, device=a.device, dtype=a.dtype, max_num_seqs=max(a.batch),
                    max_model_len=1024, num_kv_pages=a.num_kv_pages,
                    cuda_graphs=not a.no_graphs, kv_cache_dtype=a.kv_cache_dtype)
    load_s = time.perf_counter() - t
    graphs = engine.runner.graphs is not None
    print(f"engine ready in {load_s:.1f}s, CUDA graphs: {graphs}", flush=True)
    rows = {}
    dev_name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    out = dict(command="python " + " ".join(sys.argv),
               date=datetime.date.today().isoformat(), device=dev_name,
               torch=torch.__version__, model=a.model, prompt_len=PROMPT_LEN,
               kv_cache_dtype=a.kv_cache_dtype,
               new_tokens=a.new_tokens, cuda_graphs=graphs, load_s=load_s,
               rows=rows)
    if a.device == "cuda":
        # the speed of light of a B=1 step: this model's active weight bytes over the copy
        # bandwidth measured here (before any timing; the engine's graphs are captured)
        wb = active_weight_bytes(engine.runner.model, engine.hf_config)
        bw = measure_bandwidth()
        out.update(active_weight_bytes=wb, copy_bandwidth_tb_s=round(bw / 1e12, 3),
                   speed_of_light_ms=round(wb / bw * 1e3, 4))
        print(f"active weights {wb / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s -> "
              f"B=1 speed of light {wb / bw * 1e3:.3f} ms", flush=True)

    def dump():  # after every row, so a later failure keeps what was measured
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)

    for b in a.batch:
        ms, tps = engine_figures(engine, b, a.new_tokens)
        rows[f"engine_b{b}"] = dict(decode_ms_per_step=ms, tok_s=tps)
        print(f"engine B={b}: decode {ms:.2f} ms/step, {tps:.0f} tok/s", flush=True)
        dump()
    if a.profile:
        rows["engine_b1_gpu_time_ms"] = profile_decode(engine)
        for k, v in rows["engine_b1_gpu_time_ms"]:
            print(f"  {v:8.3f} ms  {k[:90]}")
    if "engine_b1" in rows and out.get("speed_of_light_ms"):
        rows["engine_b1"]["x_speed_of_light"] = round(
            rows["engine_b1"]["decode_ms_per_step"] / out["speed_of_light_ms"], 3)
    if not a.no_hf:
        from transformers import AutoConfig, AutoModelForCausalLM

        import gc
        del engine   # (its figures are taken) room for HF's own copy of a large model
        gc.collect()
        torch.cuda.empty_cache() if a.device == "cuda" else None
        d = _hf_config_dict(a.model)
        cfg = AutoConfig.for_model(d.pop("model_type"), **d)
        with torch.device(a.device):
            hf = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, a.dtype)).eval()
        for b in a.batch:
            ms, tps = hf_figures(hf, b, a.new_tokens)
            rows[f"hf_b{b}"] = dict(decode_ms_per_step=ms, tok_s=tps)
            print(f"HF generate B={b}: decode {ms:.2f} ms/step, {tps:.0f} tok/s", flush=True)
            dump()
    dump()


if __name__ == "__main__":
    main()
