"""Issue 20's later-turn TTFT on the H200 (dummy Llama-3-8B, 64k context, ~50.8k cached + 800
new tokens): benchmarks/agentic_engine_bench.py's way and benchmarks/ttft_profile_probe.py's way
of measuring it side by side in one engine, each turn split into host and device time.

    PYTHONPATH=$PWD python benchmarks/s16_ttft_gpu.py $OUT [budget_s, default 190]

Session 15 measured 74.1 ms (the bench, median of 5 later turns) against 61.6-68.6 ms (the
probe's unprofiled later turns) and ~58-60 ms of device time. Per later turn this script records
host timestamps (add_request, the model forward's start and return, the first token) and CUDA
events (at the forward's start, after its last layer, after the step's ids copy), so that
TTFT = add_request (bench clock only) + host before the forward (scheduler plan, step
metadata upload, attention plans: the GPU idles) + the step's device time + host after it
(ids read, scheduler advance, outputs; in the bench also the first decode step's launch).
"forward host" is the time the host took to enqueue the forward; above "forward device" the
forward is host-bound. The paged extend's split count of each turn is recorded (it alternates
with the number of tokens a turn computes).

Stages (each within the budget; what does not fit is skipped and says so):
1. the copy roofline (a 1 GiB device-to-device copy);
2. engine A, the bench's settings (max_num_seqs 64, gpu_memory_utilization 0.9, page 64);
3. checks: (a) the later turn's paged extend (auto splits, and 4 / 5 forced) on the live KV
   cache of a conversation against an fp32 reference over the request's pages (rows at both
   ends and in the middle; outputs NaN-poisoned first); (b) a later turn end to end: its first
   token's top-5 logprobs with the prefix cached vs the same prompt computed uncached (another
   cache salt), both greedy;
4. flows on engine A, each on its own conversation (a 50k-token first turn, one untimed later
   turn, then timed ones): "bench" (sampling at temperature 1, 64 outputs kept in the
   conversation, clock from before add_request), "bench_greedy" (the same, greedy: the
   sampling path's share), "probe" (greedy, 1 output, clock from after add_request), then
   "probe_s4" / "probe_s5" (the probe with the extend's splits forced to 4 / 5);
5. engine B, the probe's settings (max_num_seqs 8, gpu_memory_utilization 0.85), flow
   "probe" again (engine A is released first).
JSON: $OUT/s16_ttft_gpu.json; a table last. Expected run time ~110-170 s (engine starts with a
cold Triton cache are the larger part). `--device cpu` smoke-tests the script on a tiny model.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tskernels  # noqa: E402
from serve import model_runner  # noqa: E402
from serve.engine import Engine, SamplingParams  # noqa: E402

MODEL = "dummy:" + os.path.join(ROOT, "benchmarks/configs/llama-3-8b-64k.json")
CONTEXT, NEW, OUTPUT = 50000, 800, 64
T0 = time.time()
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64,
            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, rms_norm_eps=1e-5, hidden_act="silu",
            bos_token_id=1, eos_token_id=2, max_position_embeddings=8192,
            tie_word_embeddings=False)


def left(budget: float) -> float:
    return budget - (time.time() - T0)


class _Event:
    """A CUDA timing event, or on the CPU (smoke runs) a host timestamp."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.ev = torch.cuda.Event(enable_timing=True) if cuda else None
        self.t = 0.0

    def record(self):
        if self.cuda:
            self.ev.record()
        else:
            self.t = time.perf_counter()
        return self

    def ms_to(self, later: _Event) -> float:
        if self.cuda:
            later.ev.synchronize()
            return self.ev.elapsed_time(later.ev)
        return (later.t - self.t) * 1e3


class TurnProbe:
    """Timestamps and events of the first prefill step of a turn (see the module docstring),
    installed by wrapping the engine's functions; `reset()` before each turn."""

    def __init__(self, eng: Engine):
        self.eng, self.cuda = eng, eng.device.type == "cuda"
        self.rec: dict = {}
        self._undo = []
        probe = self

        def wrap(owner, attr, before=None, after=None):
            fn = getattr(owner, attr)
            own = attr in vars(owner)
            self._undo.append((owner, attr, vars(owner).get(attr), own))

            def timed(*a, **k):
                if before:
                    before()
                out = fn(*a, **k)
                if after:
                    after(out)
                return out
            setattr(owner, attr, timed)

        def add_begin():
            probe.rec.setdefault("t_add0", time.perf_counter())

        def add_end(_):
            probe.rec.setdefault("t_add1", time.perf_counter())

        def fw_begin():
            if "t_fw0" not in probe.rec:
                probe.rec["t_fw0"] = time.perf_counter()
                probe.rec["ev_fw0"] = _Event(probe.cuda).record()

        def fw_end(_):
            if "t_fw1" not in probe.rec:
                probe.rec["ev_fw1"] = _Event(probe.cuda).record()
                probe.rec["t_fw1"] = time.perf_counter()

        def launch_end(_):
            if "t_fw1" in probe.rec and "ev_step1" not in probe.rec:
                probe.rec["ev_step1"] = _Event(probe.cuda).record()

        def plan_end(plan):
            probe.rec.setdefault("splits", getattr(plan, "splits", None))
            probe.rec.setdefault("plan_repr", repr(plan)[:200])

        wrap(Engine, "add_request", add_begin, add_end)
        wrap(eng.model, "forward", fw_begin, fw_end)
        wrap(model_runner.ModelRunner, "launch", None, launch_end)
        wrap(tskernels.attention, "extend_plan", None, plan_end)

    def reset(self):
        self.rec = {}

    def undo(self):
        for owner, attr, old, own in reversed(self._undo):
            if own:
                setattr(owner, attr, old)
            else:
                delattr(owner, attr)

    def turn(self, t_first: float) -> dict:
        r = self.rec
        ms = lambda a, b: (b - a) * 1e3  # noqa: E731
        step_dev = r["ev_fw0"].ms_to(r["ev_step1"])
        out = {"add_request_ms": ms(r["t_add0"], r["t_add1"]),
               "ttft_bench_clock_ms": ms(r["t_add0"], t_first),
               "ttft_probe_clock_ms": ms(r["t_add1"], t_first),
               "host_before_forward_ms": ms(r["t_add1"], r["t_fw0"]),
               "forward_host_ms": ms(r["t_fw0"], r["t_fw1"]),
               "forward_device_ms": r["ev_fw0"].ms_to(r["ev_fw1"]),
               "step_device_ms": step_dev, "splits": r.get("splits")}
        # what the device did not hide (the forward's start is the step's first device work
        # of note; the GPU idles before it)
        out["host_exposed_ms"] = out["ttft_probe_clock_ms"] - step_dev
        out["host_after_step_ms"] = out["host_exposed_ms"] - out["host_before_forward_ms"]
        return out


def run_turn(eng, probe, rid, prompt, *, temperature, n_out):
    """(turn record, output ids) of one request run alone."""
    sp = SamplingParams(max_tokens=n_out, ignore_eos=True,
                        **({} if temperature is None else {"temperature": temperature}))
    probe.reset()
    eng.add_request(rid, prompt, sp)
    t_first, ids, cached = None, [], 0
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid and o.new_token_ids:
                if t_first is None:
                    t_first, cached = time.perf_counter(), o.cached_tokens
                ids += o.new_token_ids
    rec = probe.turn(t_first)
    rec.update(prompt=len(prompt), cached=cached, computed=len(prompt) - cached)
    return rec, ids


FLOWS = {   # name: (temperature (None: SamplingParams' default 1.0), outputs, keep outputs)
    "bench": (None, OUTPUT, True),
    "bench_greedy": (0.0, OUTPUT, True),
    "probe": (0.0, 1, False),
}


def flow(eng, probe, name, rng, turns, *, context, new, forced_splits=None):
    """A conversation: first turn, one untimed later turn, `turns` timed later turns."""
    base = name.split("_s")[0]
    temperature, n_out, keep = FLOWS[base]
    vocab = int(eng.hf_config.vocab_size)
    toks = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
    from tskernels.ops.attention import cuda_extend
    old_splits = cuda_extend.DEFAULT_SPLITS
    cuda_extend.DEFAULT_SPLITS = forced_splits if forced_splits else old_splits
    try:
        history = toks(context)
        _, out = run_turn(eng, probe, f"{name}-0", history, temperature=temperature,
                          n_out=n_out)
        history = history + out if keep else history
        recs = []
        for t in range(turns + 1):
            prompt = history + toks(new)
            rec, out = run_turn(eng, probe, f"{name}-{t + 1}", prompt, temperature=temperature,
                                n_out=n_out)
            history = prompt + out if keep else prompt
            if t:
                recs.append(rec)
    finally:
        cuda_extend.DEFAULT_SPLITS = old_splits
    keys = [k for k in recs[0] if isinstance(recs[0][k], float)]
    med = {k: round(statistics.median(r[k] for r in recs), 3) for k in keys}
    return {"flow": name, "temperature": temperature, "outputs": n_out,
            "forced_splits": forced_splits, "turns": recs, "median": med}


class _Salted:
    """The engine's scheduler submitting under another cache salt (an uncached reference)."""

    def __init__(self, inner, salt):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_salt", salt)

    def submit(self, sid, ids, max_new, stop, ignore_eos, salt):
        return self._inner.submit(sid, ids, max_new, stop, ignore_eos, self._salt)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def _first_logprobs(eng, rid, prompt):
    eng.add_request(rid, prompt, SamplingParams(max_tokens=1, temperature=0.0, logprobs=5,
                                                ignore_eos=True))
    got = None
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid and o.new_token_ids:
                got = (o.new_token_ids[0], dict(o.top_logprobs[0]), o.cached_tokens)
    return got


def check_end_to_end(eng, rng, context, new) -> dict:
    """A later turn's first token with the prefix cached vs the same prompt uncached."""
    vocab = int(eng.hf_config.vocab_size)
    toks = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
    history = toks(context)
    _first_logprobs(eng, "e2e-0", history)
    prompt = history + toks(new)
    tok_c, top_c, cached_c = _first_logprobs(eng, "e2e-cached", prompt)
    inner = eng.scheduler
    eng.scheduler = _Salted(inner, 12345)
    try:
        tok_r, top_r, cached_r = _first_logprobs(eng, "e2e-uncached", prompt)
    finally:
        eng.scheduler = inner
    common = sorted(set(top_c) & set(top_r))
    diff = max((abs(top_c[t] - top_r[t]) for t in common), default=float("inf"))
    ranked = sorted(top_r, key=lambda t: -top_r[t])
    margin = top_r[ranked[0]] - top_r[ranked[1]] if len(ranked) > 1 else float("inf")
    ok = (cached_c > 0 and cached_r == 0 and len(common) >= 3 and diff <= 0.15
          and (tok_c == tok_r or (tok_c in ranked[:2] and margin <= 0.15)))
    return {"ok": bool(ok), "cached_tokens": [cached_c, cached_r], "tokens": [tok_c, tok_r],
            "top5_common": len(common), "max_logprob_diff": diff, "ref_top2_margin": margin}


def check_extend(eng, rng, context, new, splits_list) -> dict:
    """The paged extend over a live conversation's pages (layer 0's cache, random q) for each
    split setting vs an fp32 reference at sampled rows; outputs NaN-poisoned first."""
    from tskernels.ops.attention import cuda_extend
    vocab = int(eng.hf_config.vocab_size)
    toks = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
    history = toks(context)
    _first_logprobs(eng, "ext-0", history)
    got = {}
    real = tskernels.attention.extend_plan

    def keep(*a, **k):
        got.setdefault("args", (a, k))
        return real(*a, **k)
    tskernels.attention.extend_plan = keep
    try:
        _first_logprobs(eng, "ext-1", history + toks(new))
    finally:
        tskernels.attention.extend_plan = real
    (qo, table, lens), kw = got["args"][0][:3], got["args"][1]
    pool = eng.runner.pool
    kc, vc = pool.k[0], pool.v[0]
    T, hq = int(qo[-1]), kw["num_q_heads"]
    L = int(lens[0])
    ps, hkv, d = kc.shape[1], kc.shape[2], kc.shape[3]
    gen = torch.Generator(device=kc.device).manual_seed(0)
    q = torch.randn(T, hq, d, generator=gen, device=kc.device).to(kc.dtype)
    pages = table[0, :(L + ps - 1) // ps].long()
    K = kc[pages].reshape(-1, hkv, d)[:L].float()
    V = vc[pages].reshape(-1, hkv, d)[:L].float()
    rows = sorted({0, 1, T // 2, T - 2, T - 1, *range(0, T, max(1, T // 16))})
    scale = d ** -0.5
    ref = []
    for r in rows:
        pos = L - T + r
        qr = q[r].float().view(hkv, hq // hkv, d)
        s = torch.einsum("hgd,khd->hgk", qr, K[:pos + 1]) * scale
        ref.append(torch.einsum("hgk,khd->hgd", s.softmax(-1), V[:pos + 1]).reshape(hq, d))
    ref = torch.stack(ref)
    res = {"rows": len(rows), "T": T, "L": L}
    old = cuda_extend.DEFAULT_SPLITS
    try:
        for s in splits_list:
            cuda_extend.DEFAULT_SPLITS = s
            plan = real(qo, table, lens, **kw)
            o = torch.full_like(q, float("nan"))
            plan.run(q, kc, vc, out=o, k_scale=pool.scale, v_scale=pool.scale)
            out = o[rows].float()
            err = (out - ref).abs().max().item()
            tol = 2e-2 * max(1.0, ref.abs().max().item())
            res[f"splits={s}"] = {"plan_splits": getattr(plan, "splits", None), "max_err": err,
                                  "nan": bool(torch.isnan(o).any()), "ok": err <= tol
                                  and not bool(torch.isnan(o).any())}
    finally:
        cuda_extend.DEFAULT_SPLITS = old
    res["ok"] = all(v["ok"] for k, v in res.items() if k.startswith("splits="))
    return res


def build(device, cfg_path, kind):
    kw = dict(device=device)
    if device == "cuda":
        kw.update(max_model_len=57344)   # (the probe's; the bench derives 55,312 from its turns)
        kw.update(dict(max_num_seqs=64, gpu_memory_utilization=0.9) if kind == "A" else
                  dict(max_num_seqs=8, gpu_memory_utilization=0.85))
    else:
        kw.update(max_model_len=4096, max_num_seqs=8, overlap_schedule=True,
                  chunked_prefill_size=2048)
    t0 = time.time()
    eng = Engine(cfg_path, **kw)
    return eng, {"engine": kind, "args": {k: v for k, v in kw.items()},
                 "page_size": eng.args.page_size, "start_s": round(time.time() - t0, 1)}


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "."
    budget = float(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") \
        else 190.0
    device = "cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] \
        == "cpu" else "cuda"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "s16_ttft_gpu.json")
    doc: dict = {"command": "python benchmarks/s16_ttft_gpu.py " + " ".join(sys.argv[1:]),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                 "stages": {}, "flows": [], "skipped": []}

    def save():
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)

    tmp = tempfile.TemporaryDirectory()
    if device == "cuda":
        model, context, new, turns = MODEL, CONTEXT, NEW, 4
    else:
        cfg = os.path.join(tmp.name, "config.json")
        with open(cfg, "w") as f:
            json.dump(TINY, f)
        model, context, new, turns = "dummy:" + cfg, 600, 48, 2
        FLOWS.update({k: (t, min(n, 4), keep) for k, (t, n, keep) in FLOWS.items()})
    from tskernels.bench.core import copy_bandwidth
    doc["copy_roofline_GBps"] = round(copy_bandwidth(device), 1)
    print(f"copy roofline {doc['copy_roofline_GBps'] / 1e3:.2f} TB/s", flush=True)
    rng = np.random.default_rng(0)
    eng, info = build(device, model, "A")
    doc["stages"]["engine_A"] = info
    print(f"engine A: {info}", flush=True)
    probe = TurnProbe(eng)
    save()
    # checks before any timing
    try:   # (on the CPU: the CPU extend, which ignores the split setting)
        doc["check_extend"] = check_extend(eng, rng, context, new, [None, 4, 5])
    except Exception as e:  # noqa: BLE001 - reported, and the timings say unchecked
        doc["check_extend"] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                               "trace": traceback.format_exc()[-2000:]}
    print(f"check (paged extend vs fp32, live cache): {doc['check_extend']}", flush=True)
    try:
        doc["check_end_to_end"] = check_end_to_end(eng, rng, context, new)
    except Exception as e:  # noqa: BLE001
        doc["check_end_to_end"] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                   "trace": traceback.format_exc()[-2000:]}
    print(f"check (cached vs uncached later turn): {doc['check_end_to_end']}", flush=True)
    save()
    plan = [("bench", None, 14), ("probe", None, 6), ("bench_greedy", None, 14),
            ("probe_s4", 4, 6), ("probe_s5", 5, 6)]
    for name, forced, need in plan:
        if device != "cuda" and forced:
            continue
        if left(budget) < need + 45:   # (45 s kept for engine B)
            doc["skipped"].append(name)
            continue
        t0 = time.time()
        try:
            r = flow(eng, probe, name, rng, turns, context=context, new=new,
                     forced_splits=forced)
        except Exception as e:  # noqa: BLE001 - the other flows still run
            doc["skipped"].append(f"{name}: {type(e).__name__}: {e}")
            print(traceback.format_exc(), flush=True)
            continue
        r.update(engine="A", wall_s=round(time.time() - t0, 1))
        doc["flows"].append(r)
        save()
        print(f"{name}: {r['median']}; splits {[t['splits'] for t in r['turns']]}, computed "
              f"{[t['computed'] for t in r['turns']]}", flush=True)
    probe.undo()
    del probe, eng
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    if left(budget) > 45:
        try:
            eng, info = build(device, model, "B")
            doc["stages"]["engine_B"] = info
            print(f"engine B: {info}", flush=True)
            probe = TurnProbe(eng)
            if left(budget) > 8:
                r = flow(eng, probe, "probe", rng, turns, context=context, new=new)
                r.update(engine="B")
                doc["flows"].append(r)
            probe.undo()
        except Exception as e:  # noqa: BLE001 - engine A's figures stand without it
            doc["stages"]["engine_B"] = {"error": f"{type(e).__name__}: {e}"}
    else:
        doc["skipped"].append("engine_B")
    doc["wall_s"] = round(time.time() - T0, 1)
    save()
    print(f"\nchecks: extend {doc.get('check_extend', {}).get('ok')}, end to end "
          f"{doc['check_end_to_end'].get('ok')}; skipped {doc['skipped']}; {doc['wall_s']} s")
    cols = ("ttft_bench_clock_ms", "ttft_probe_clock_ms", "add_request_ms",
            "host_before_forward_ms", "forward_host_ms", "forward_device_ms", "step_device_ms",
            "host_exposed_ms", "host_after_step_ms")
    print("flow (engine) | splits | computed | " + " | ".join(c.removesuffix("_ms")
                                                             for c in cols) + "  (ms, medians)")
    for r in doc["flows"]:
        m = r["median"]
        print(f"{r['flow']} ({r['engine']}) | {[t['splits'] for t in r['turns']]} | "
              f"{[t['computed'] for t in r['turns']]} | "
              + " | ".join(f"{m.get(c, float('nan')):.2f}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
