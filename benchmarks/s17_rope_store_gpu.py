"""attention.rope_store_kv (q/k norm + RoPE + K/V store, one launch) on the GPU: checks, then
the fused launch vs the separate ones as graph replays, in one device call (~60 s):

    PYTHONPATH=$PWD python benchmarks/s17_rope_store_gpu.py $OUT [budget_s, default 240]

Shapes (bf16, page 64): Llama-3-8B (Hq 32, Hkv 8, D 128, no q/k norm: separate = RoPE + store,
2 launches) and Qwen3-30B-A3B (Hq 32, Hkv 4, D 128, q/k norm: separate = q norm + k norm +
RoPE + store, 4 launches), T = 1, 8, 64 tokens, q/k/v as views of one qkv row as served.

1. Checks (each before anything is timed): the fused Triton kernel against the float64
   reference and the same-precision reference (q_out, the written K rows; V and every
   unwritten, NaN-poisoned row bit-exact), against the separate ops as serving runs them
   (bit-exact without the norm), plain and chained (shared/pdl.CHAIN), eagerly and as a
   captured CUDA graph replayed with re-poisoned outputs.
2. Timing: median µs per call of each form, captured back to back in one CUDA graph (the
   shipped CHAIN, every kernel chained, and CHAIN off), cycling through 4 input sets; the
   saving x the model's layers = ms per decode step.

JSON: $OUT/s17_rope_store.json; a table last. Without CUDA it runs the checks only, on the CPU
through the Triton interpreter (fp16, T <= 8): a smoke test of this script.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float16
PAGE, PAGES, EPS = 64, 64, 1e-6
# name: (Hq, Hkv, D, q/k norm, layers)
MODELS = {"Llama-3-8B": (32, 8, 128, False, 32), "Qwen3-30B-A3B": (32, 4, 128, True, 48)}
TOKENS = (1, 8, 64) if DEV == "cuda" else (1, 8)
T0 = time.time()


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def chain_names(mode: str):
    from tskernels.ops.shared import pdl
    return {"shipped": pdl.CHAIN, "all": frozenset(pdl.NAMES), "off": frozenset()}[mode]


class chain:
    """shared/pdl.CHAIN set to `names` inside the block (read at every launch)."""

    def __init__(self, names):
        self.names = frozenset(names)

    def __enter__(self):
        from tskernels.ops.shared import pdl
        self.keep, pdl.CHAIN = pdl.CHAIN, self.names

    def __exit__(self, *exc):
        from tskernels.ops.shared import pdl
        pdl.CHAIN = self.keep


def problem(model: str, T: int, seed: int) -> dict:
    """One decode step's inputs: q/k/v views of a qkv row, NaN-poisoned caches, distinct
    slots (the last one -1 when T > 1: a CUDA-graph padding row)."""
    import tskernels
    hq, hkv, d, norm, _ = MODELS[model]
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(DEV, DTYPE)
    q, k, v = (x.view(T, h, d) for x, h in zip(qkv.split([hq * d, hkv * d, hkv * d], dim=-1),
                                               (hq, hkv, hkv)))
    slots = torch.randperm(PAGES * PAGE, generator=g)[:T].to(DEV)
    if T > 1:
        slots[-1] = -1
    w = [(torch.rand(d, generator=g) + 0.5).to(DEV, DTYPE) if norm else None for _ in range(2)]
    kc = torch.full((PAGES, PAGE, hkv, d), float("nan"), device=DEV, dtype=DTYPE)
    return dict(qkv=qkv, q=q, k=k, v=v, kc=kc, vc=kc.clone(), slots=slots,
                pos=torch.randint(0, 4096, (T,), generator=g).to(DEV, torch.int32),
                table=tskernels.rope.cos_sin_cache(4096, d, 1e6, device=DEV), qw=w[0], kw=w[1])


def fused(p: dict) -> torch.Tensor:
    import tskernels
    return tskernels.attention.rope_store_kv(
        p["q"], p["k"], p["v"], p["pos"], p["table"], p["kc"], p["vc"], p["slots"],
        q_norm_weight=p["qw"], k_norm_weight=p["kw"], eps=EPS, backend="triton")


def separate(p: dict) -> torch.Tensor:
    """What serving launched before: (q norm, k norm,) RoPE of q and k, the K/V store."""
    import tskernels
    q, k = p["q"], p["k"]
    if p["qw"] is not None:
        q, k = tskernels.norm.rmsnorm(q, p["qw"], EPS), tskernels.norm.rmsnorm(k, p["kw"], EPS)
    q, k = tskernels.rope.apply_rope(q, k, p["pos"], p["table"])
    tskernels.attention.store_kv(k, p["v"], p["kc"], p["vc"], p["slots"])
    return q


def _nan_eq(a, b) -> bool:
    return torch.equal(a.float().nan_to_num(7.5), b.float().nan_to_num(7.5))


# ---- 1. checks -------------------------------------------------------------------------------
def check(model: str, T: int) -> str:
    import tskernels_ref.attention as ref
    p = problem(model, T, seed=T)
    args = [p[n] for n in ("q", "k", "v", "pos", "table")]
    kc64, vc64 = p["kc"].double(), p["vc"].double()
    q64 = ref.rope_store_kv(*(a.double() if a.is_floating_point() else a for a in args), kc64,
                            vc64, p["slots"], q_norm_weight=None if p["qw"] is None else
                            p["qw"].double(), k_norm_weight=None if p["kw"] is None else
                            p["kw"].double(), eps=EPS)
    kcb, vcb = p["kc"].clone(), p["vc"].clone()
    qb = ref.rope_store_kv(*args, kcb, vcb, p["slots"], q_norm_weight=p["qw"],
                           k_norm_weight=p["kw"], eps=EPS)
    sep = dict(p, kc=p["kc"].clone(), vc=p["vc"].clone())
    qs = separate(sep)
    same = []
    for mode in ("off", "all"):
        with chain(chain_names(mode)):
            got = dict(p, kc=p["kc"].clone(), vc=p["vc"].clone())
            qo = fused(got)
            same.append(_compare(qo, got, q64, kc64, qb, kcb, vcb, qs, sep, f"{mode} eager"))
            if DEV == "cuda":
                same.append(_graph_check(got, q64, kc64, qb, kcb, vcb, qs, sep, p, mode))
    # without the norm the fused kernel does the separate ops' arithmetic: expected bit-exact
    return "ok" + ("" if p["qw"] is not None or all(same) else
                   " (within tolerance, not bit-exact vs the separate ops)")


def _compare(qo, got, q64, kc64, qb, kcb, vcb, qs, sep, name) -> bool:
    """Asserts the fused result against the references; returns whether it equals the separate
    ops' bit for bit (it must be within the tolerance of them either way)."""
    from tskernels.numerics import assert_close
    assert_close(qo, q64, baseline=qb, name=f"q_out {name}")
    assert torch.equal(got["kc"].isnan(), kcb.isnan()), f"{name}: written K rows differ"
    assert_close(got["kc"].nan_to_num(7.5), kc64.nan_to_num(7.5),
                 baseline=kcb.nan_to_num(7.5), name=f"k_cache {name}")
    assert _nan_eq(got["vc"], vcb), f"{name}: v_cache differs from the reference"
    assert _nan_eq(got["vc"], sep["vc"]), f"{name}: v_cache differs from store_kv's"
    assert torch.equal(got["kc"].isnan(), sep["kc"].isnan())
    assert_close(qo, qs.double(), baseline=qb, name=f"q_out vs separate {name}")
    return torch.equal(qo, qs) and _nan_eq(got["kc"], sep["kc"])


def _graph_check(got, q64, kc64, qb, kcb, vcb, qs, sep, p, mode):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fused(got)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qo = fused(got)
    same = True
    for _ in range(2):
        qo.fill_(float("nan"))
        got["kc"].copy_(p["kc"])  # the NaN-poisoned caches again
        got["vc"].copy_(p["vc"])
        g.replay()
        torch.cuda.synchronize()
        same &= _compare(qo, got, q64, kc64, qb, kcb, vcb, qs, sep, f"{mode} graph")
    return same


# ---- 2. timing -------------------------------------------------------------------------------
def timing(model: str, T: int) -> dict:
    from tskernels.bench import core
    sets = [problem(model, T, seed=100 + i) for i in range(4)]
    out = {}
    for mode in ("shipped", "all", "off"):
        with chain(chain_names(mode)):
            for name, fn in (("fused", fused), ("separate", separate)):
                out[f"{name}_{mode}"] = round(statistics.median(
                    core.time_fn(fn, sets, "cuda", iters=200, graph=True)), 3)
    return out


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 240.0
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = dict(command="PYTHONPATH=$PWD python benchmarks/s17_rope_store_gpu.py $OUT "
                       f"{budget:.0f}", date=time.strftime("%Y-%m-%d %H:%M"),
               device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)",
               torch=torch.__version__, dtype=str(DTYPE), page=PAGE,
               models={k: dict(Hq=a, Hkv=b, D=c, qk_norm=n, layers=l)
                       for k, (a, b, c, n, l) in MODELS.items()},
               checks={}, us={})
    path = out_dir / "s17_rope_store.json"

    def dump():
        doc["seconds"] = round(time.time() - T0, 1)
        path.write_text(json.dumps(doc, indent=1))
    for model in MODELS:
        for T in TOKENS:
            key = f"{model} T={T}"
            try:
                doc["checks"][key] = check(model, T)
            except Exception as e:  # recorded; a failed shape is not timed
                doc["checks"][key] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            print(f"check {key}: {doc['checks'][key]}", flush=True)
    dump()
    if DEV == "cuda":
        for model in MODELS:
            for T in TOKENS:
                key = f"{model} T={T}"
                if not doc["checks"][key].startswith("ok") or left(budget) < 20:
                    continue
                try:
                    doc["us"][key] = timing(model, T)
                except Exception as e:
                    doc["us"][key] = dict(error=repr(e)[:300])
                    traceback.print_exc()
                print(f"time {key}: {doc['us'][key]}", flush=True)
                dump()
    print("\n| shape | T | fused µs | separate µs | saved µs/layer | saved ms/step | "
          "CHAIN off: fused / separate µs |\n| --- | --- | --- | --- | --- | --- | --- |")
    for key, u in doc["us"].items():
        if "fused_shipped" not in u:
            continue
        model, T = key.split(" T=")
        saved = u["separate_shipped"] - u["fused_shipped"]
        print(f"| {model} | {T} | {u['fused_shipped']} | {u['separate_shipped']} | "
              f"{saved:.2f} | {saved * MODELS[model][4] / 1e3:.3f} | "
              f"{u['fused_off']} / {u['separate_off']} |")
    bad = [k for k, v in doc["checks"].items() if not v.startswith("ok")]
    dump()
    print(f"checks: {len(bad)} failed {bad}; total {doc['seconds']} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
