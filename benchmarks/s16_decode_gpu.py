"""Chained decode launches for issue 24's B = 1 target (dummy Llama-3-8B, bf16, H200): checks,
a decode layer's timing old vs new, and the serving A/B, in one device call (~150 s):

    PYTHONPATH=$PWD python benchmarks/s16_decode_gpu.py $OUT [budget_s, default 185]

The switches A/B'd (all off by default: "old" is what ships):
- triton_gemv.PREFETCH_TILES (P): the 16-bit gemv as a PDL launch that triggers its dependents
  at once and asks L2 for the first P weight tiles of each program *before* its
  griddepcontrol.wait, so a projection's weight stream starts while the kernel before it runs;
- tskernels.ops.shared.pdl.CHAIN: RMSNorm, SiLU-mul, RoPE, the K/V store and the split-KV merge
  as programmatic dependents that trigger their own dependents at program start (so the next
  gemv's programs become resident and prefetch while these small kernels run);
- rope.triton.ONE_LAUNCH: q and k rotated by one launch.

1. Checks on the GPU (every variant before it is timed): the changed kernels against the
   float64 / float32 references at the Llama shapes (RMSNorm, add + RMSNorm, SiLU-mul, RoPE,
   K/V store, the decode merge, the gemv at P = 2 / 4 / 8, M = 1 and 16), then the whole
   decode layer (add + RMSNorm, qkv, RoPE, store, split-KV decode + merge, o, add + RMSNorm,
   gate-up, SiLU-mul, down) per variant against the old eager launches, eagerly and as a
   captured CUDA graph replayed with NaN-poisoned outputs.
2. Timing: that layer at B = 1 as one CUDA graph of back-to-back layers cycling through 4
   weight copies (436 MB each, far beyond the 50 MB L2), median µs per layer (x 32 = ms per
   step); the 4 projections alone (gemv chain) old vs prefetch; the copy roofline.
3. Serving: benchmarks/serve_ab.py --batch 1 --new-tokens 48 --no-hf on dummy:llama-3-8b,
   old vs the fastest checked layer variant (then, budget left, the next one), ms/step.

JSON: $OUT/s16_decode.json (and the serving runs' s16_serve_*.json); a table last.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 4096, 32, 8, 128, 14336
PAGE, SEQ, MAX_LEN = 64, 152, 1024   # the engine's GPU page size and max_model_len
DEV, DTYPE = "cuda", torch.bfloat16  # (a CPU smoke run sets cpu / float16, small shapes)
ALL = ("rmsnorm", "act_and_mul", "rope", "store_kv", "merge")
# name: (CHAIN, PREFETCH_TILES, ONE_LAUNCH)
VARIANTS = {
    "old": ((), 0, False),
    "prefetch4": ((), 4, False),
    "chain": (ALL, 0, True),
    "chain+prefetch2": (ALL, 2, True),
    "chain+prefetch4": (ALL, 4, True),
    "chain+prefetch8": (ALL, 8, True),
}
T0 = time.time()


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def variant(name: str):
    return switches(*VARIANTS[name])


@contextlib.contextmanager
def switches(chain, tiles: int, one: bool):
    from tskernels.ops.gemm import triton_gemv
    from tskernels.ops.rope import triton as rope_triton
    from tskernels.ops.shared import pdl
    keep = pdl.CHAIN, triton_gemv.PREFETCH_TILES, rope_triton.ONE_LAUNCH
    pdl.CHAIN, triton_gemv.PREFETCH_TILES, rope_triton.ONE_LAUNCH = frozenset(chain), tiles, one
    try:
        yield
    finally:
        pdl.CHAIN, triton_gemv.PREFETCH_TILES, rope_triton.ONE_LAUNCH = keep


def _rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(DTYPE)


# ---- 1. kernel checks ------------------------------------------------------------------------
def check_kernels() -> dict:
    import tskernels
    import tskernels_ref.activation as ref_act
    import tskernels_ref.attention as ref_attn
    import tskernels_ref.norm as ref_norm
    import tskernels_ref.rope as ref_rope
    from tskernels.numerics import assert_close
    g = torch.Generator(device=DEV).manual_seed(1)
    out = {}

    def check(name, fn):
        try:
            fn()
            out[name] = "ok"
        except Exception as e:  # recorded; the variants that need it are not timed
            out[name] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
        print(f"check {name}: {out[name]}", flush=True)

    for m in (1, 16):
        x, r = _rnd(g, m, HIDDEN, scale=3), _rnd(g, m, HIDDEN)
        w = 1 + _rnd(g, HIDDEN, scale=0.1)

        def norm():
            with variant("chain"):
                y = tskernels.norm.rmsnorm(x, w, 1e-5)
                y2, r2 = tskernels.norm.fused_add_rmsnorm(x, r, w, 1e-5)
            assert_close(y, ref_norm.rmsnorm(x.double(), w.double(), 1e-5),
                         baseline=ref_norm.rmsnorm(x, w, 1e-5), name="rmsnorm")
            assert_close(r2, x.double() + r.double(), baseline=x + r, name="residual")
            assert_close(y2, ref_norm.rmsnorm((x + r).double(), w.double(), 1e-5),
                         baseline=ref_norm.rmsnorm(x + r, w, 1e-5), name="add+rmsnorm")
        check(f"rmsnorm chained M={m}", norm)
        gu = _rnd(g, m, 2 * INTER, scale=2)

        def silu():
            with variant("chain"):
                y = tskernels.activation.silu_and_mul(gu)
            assert_close(y, ref_act.silu_and_mul(gu.double()), baseline=ref_act.silu_and_mul(gu))
        check(f"silu_and_mul chained M={m}", silu)

    cache = tskernels.rope.cos_sin_cache(4096, HEAD_DIM, 500000.0, device=DEV)
    for t in (1, 16):
        qkv = _rnd(g, t, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        q = qkv[:, :HEADS * HEAD_DIM].view(t, HEADS, HEAD_DIM)
        k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].view(t, KV_HEADS, HEAD_DIM)
        pos = torch.randint(0, 4096, (t,), device=DEV)

        def rope():
            q64, k64 = ref_rope.apply_rope(q.double(), k.double(), pos, cache.double())
            qb, kb = ref_rope.apply_rope(q, k, pos, cache)
            # one launch chained / plain, two chained launches
            for name, sw in (("one launch chained", (ALL, 0, True)),
                             ("one launch", ((), 0, True)), ("chained", (ALL, 0, False))):
                with switches(*sw):
                    qo, ko = tskernels.rope.apply_rope(q, k, pos, cache)
                assert_close(qo, q64, baseline=qb, name=f"q {name}")
                assert_close(ko, k64, baseline=kb, name=f"k {name}")
        check(f"rope one launch / chained T={t}", rope)

    def store():
        kv = _rnd(g, 2, 3, KV_HEADS, HEAD_DIM)
        kc = torch.full((8, PAGE, KV_HEADS, HEAD_DIM), float("nan"), device=DEV).to(DTYPE)
        vc, kr, vr = kc.clone(), kc.clone(), kc.clone()
        slots = torch.tensor([70, -1, 5], device=DEV)
        ref_attn.store_kv(kv[0], kv[1], kr, vr, slots)
        with variant("chain"):
            tskernels.attention.store_kv(kv[0], kv[1], kc, vc, slots)
        assert torch.equal(kc.float().nan_to_num(7.5), kr.float().nan_to_num(7.5))
        assert torch.equal(vc.float().nan_to_num(7.5), vr.float().nan_to_num(7.5))
    check("store_kv chained", store)

    def merge():
        st = _attention_state(g)
        q = _rnd(g, 1, HEADS, HEAD_DIM)
        o_old = st["plan"].run(q, st["kc"], st["vc"])
        with variant("chain"):
            o_new = st["plan"].run(q, st["kc"], st["vc"])
        want = ref_attn.decode(q.double(), st["kc"].double(), st["vc"].double(),
                               st["page_table"], st["seq_lens"])
        assert_close(o_new, want, baseline=o_old.double(), name="decode + chained merge")
        out["decode_splits"] = getattr(st["plan"], "num_splits", None)
        out["decode_fused_merge"] = getattr(st["plan"], "fused_merge", None)
    check("decode merge chained", merge)

    for m in (1, 16):
        for n, k in (((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM),
                     (2 * INTER, HIDDEN), (HIDDEN, INTER)):
            x, w, r = _rnd(g, m, k), _rnd(g, n, k, scale=k ** -0.5), _rnd(g, m, n)

            def gemv(x=x, w=w, r=r):
                want = x.float() @ w.float().T + r.float()
                for name in ("prefetch4", "chain+prefetch2", "chain+prefetch8"):
                    with variant(name):
                        c = tskernels.gemm.gemv(x, w, residual=r)
                    assert_close(c, want.double(), dtype=DTYPE, name=f"gemv {name}")
            check(f"gemv prefetch M={m} {n}x{k}", gemv)
    return out


def _attention_state(g) -> dict:
    import tskernels
    pages = MAX_LEN // PAGE + 1
    kc, vc = _rnd(g, pages, PAGE, KV_HEADS, HEAD_DIM), _rnd(g, pages, PAGE, KV_HEADS, HEAD_DIM)
    perm = torch.randperm(pages, device=DEV, generator=g)
    page_table = perm[None, :MAX_LEN // PAGE].to(torch.int32).contiguous()
    seq_lens = torch.tensor([SEQ], dtype=torch.int32, device=DEV)
    plan = tskernels.attention.decode_plan(page_table, seq_lens, num_q_heads=HEADS, k_cache=kc,
                                           max_seq_len=MAX_LEN)
    last = SEQ - 1
    slot = (page_table[0, last // PAGE].long() * PAGE + last % PAGE).view(1)
    return dict(kc=kc, vc=vc, page_table=page_table, seq_lens=seq_lens, plan=plan, slot=slot,
                pos=torch.tensor([last], device=DEV))


# ---- 2. the decode layer ---------------------------------------------------------------------
def layer_weights(g) -> dict:
    return dict(qkv=_rnd(g, (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, scale=HIDDEN ** -0.5),
                o=_rnd(g, HIDDEN, HEADS * HEAD_DIM, scale=(HEADS * HEAD_DIM) ** -0.5),
                gu=_rnd(g, 2 * INTER, HIDDEN, scale=HIDDEN ** -0.5),
                down=_rnd(g, HIDDEN, INTER, scale=INTER ** -0.5),
                ln1=1 + _rnd(g, HIDDEN, scale=0.1), ln2=1 + _rnd(g, HIDDEN, scale=0.1))


def make_layer(st: dict, g):
    """One decode layer's launches at B = 1, as serve.models.layers runs them (unfused):
    layer(w) -> (the next layer's x, residual); x / residual are fixed inputs."""
    import tskernels
    gemv = tskernels.gemm.gemv
    x, res = _rnd(g, 1, HIDDEN), _rnd(g, 1, HIDDEN)
    cache = tskernels.rope.cos_sin_cache(4096, HEAD_DIM, 500000.0, device=DEV)
    q_n, kv_n = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def layer(w):
        h, r = tskernels.norm.fused_add_rmsnorm(x, res, w["ln1"], 1e-5)
        qkv = gemv(h, w["qkv"])
        q, k, v = qkv.split([q_n, kv_n, kv_n], dim=-1)
        q, k = tskernels.rope.apply_rope(q.view(1, HEADS, HEAD_DIM),
                                         k.view(1, KV_HEADS, HEAD_DIM), st["pos"], cache)
        tskernels.attention.store_kv(k, v.view(1, KV_HEADS, HEAD_DIM), st["kc"], st["vc"],
                                     st["slot"])
        o = gemv(st["plan"].run(q, st["kc"], st["vc"]).view(1, -1), w["o"])
        h, r = tskernels.norm.fused_add_rmsnorm(o, r, w["ln2"], 1e-5)
        return gemv(tskernels.activation.silu_and_mul(gemv(h, w["gu"])), w["down"]), r
    return layer


def gemv_chain(g):
    import tskernels
    gemv = tskernels.gemm.gemv
    a, h = _rnd(g, 1, HEADS * HEAD_DIM), _rnd(g, 1, HIDDEN)

    def chain(w):
        qkv = gemv(h, w["qkv"])
        h2 = gemv(a, w["o"], residual=h)
        gu = gemv(h2, w["gu"])
        return qkv, gemv(gu[:, :INTER], w["down"], residual=h2)
    return chain


def check_layer(layer, w, want, name: str) -> None:
    """The layer under `name` eagerly and as a replayed graph (outputs poisoned) equals the
    old eager launches."""
    from tskernels.numerics import assert_close
    with variant(name):
        got = layer(w)
        for a, b in zip(got, want):
            assert_close(a, b.double(), dtype=DTYPE, name=f"{name} eager")
        if DEV != "cuda":
            return
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(w)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = layer(w)
        for _ in range(3):
            for o in outs:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for a, b in zip(outs, want):
                assert_close(a, b.double(), dtype=DTYPE, name=f"{name} graph replay")


def stage_layer(budget: float, roof: float) -> dict:
    from tskernels.bench import core
    from tskernels.ops.gemm import triton_gemv
    g = torch.Generator(device=DEV).manual_seed(2)
    st = _attention_state(g)
    sets = [layer_weights(g) for _ in range(4)]
    layer = make_layer(st, g)
    wbytes = sum(t.numel() * 2 for t in sets[0].values())
    with variant("old"):
        want = [t.clone() for t in layer(sets[0])]
    res = dict(weight_MB=round(wbytes / 1e6, 1), floor_us=round(wbytes / roof / 1e3, 2),
               splits=getattr(st["plan"], "num_splits", None), checks={}, us={})
    for name in VARIANTS:
        if left(budget) < 75:
            res["checks"][name] = "not run (budget)"
            continue
        t = time.time()
        try:
            if name != "old":
                check_layer(layer, sets[0], want, name)
            res["checks"][name] = "ok"
            with variant(name):
                res["us"][name] = round(statistics.median(
                    core.time_fn(layer, sets, "cuda", iters=80, graph=True)), 2)
        except Exception as e:
            res["checks"][name] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        print(f"layer {name}: {res['checks'][name]}, {res['us'].get(name)} us "
              f"({time.time() - t:.1f} s)", flush=True)
    res["per_step_ms_x32"] = {k: round(v * 32 / 1e3, 3) for k, v in res["us"].items()}
    res["TBps"] = {k: round(wbytes / v / 1e6, 3) for k, v in res["us"].items()}
    # the 4 projections alone, back to back (no small kernels between): ramp / tail hiding
    chain = gemv_chain(g)
    res["gemv_chain_us"] = {}
    for name in ("old", "prefetch4"):
        if left(budget) < 70:
            break
        with variant(name):
            res["gemv_chain_us"][name] = round(statistics.median(
                core.time_fn(chain, sets, "cuda", iters=80, graph=True)), 2)
    print(f"gemv chain: {res['gemv_chain_us']}", flush=True)
    assert triton_gemv.PREFETCH_TILES == 0
    del sets, st
    return res


# ---- 3. serving ------------------------------------------------------------------------------
def serve_sets(name: str) -> list[str]:
    chain, tiles, one = VARIANTS[name]
    out = []
    if chain:
        out += ["--set", "tskernels.ops.shared.pdl.CHAIN=" + repr(set(chain))]
    if tiles:
        out += ["--set", f"tskernels.ops.gemm.triton_gemv.PREFETCH_TILES={tiles}"]
    if one:
        out += ["--set", "tskernels.ops.rope.triton.ONE_LAUNCH=True"]
    return out


def serve(name: str, out_dir: Path, timeout: float) -> dict:
    js = out_dir / f"s16_serve_{name.replace('+', '_')}.json"
    cmd = [sys.executable, "benchmarks/serve_ab.py", *serve_sets(name), "--", "--batch", "1",
           "--new-tokens", "48", "--no-hf", "--json", str(js)]
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        log = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        log = f"timed out after {timeout:.0f} s: {e.stdout!s:.800}"
    doc = json.loads(js.read_text()) if js.exists() else {}
    b1 = doc.get("rows", {}).get("engine_b1", {})
    ms = b1.get("decode_ms_per_step")
    print(f"serve {name}: {ms} ms/step ({time.time() - t:.1f} s)", flush=True)
    return dict(ms_per_step=ms, x_speed_of_light=b1.get("x_speed_of_light"),
                speed_of_light_ms=doc.get("speed_of_light_ms"), seconds=round(time.time() - t, 1),
                switches=doc.get("switches"), tail="" if ms is not None else log[-1500:])


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 185.0
    out_dir.mkdir(parents=True, exist_ok=True)
    from tskernels.bench import core
    doc = dict(command="PYTHONPATH=$PWD python benchmarks/s16_decode_gpu.py $OUT "
                       f"{budget:.0f}", date=time.strftime("%Y-%m-%d %H:%M"),
               device=torch.cuda.get_device_name(), torch=torch.__version__,
               variants={k: dict(CHAIN=list(c), PREFETCH_TILES=p, ONE_LAUNCH=o)
                         for k, (c, p, o) in VARIANTS.items()})
    path = out_dir / "s16_decode.json"

    def dump():
        doc["seconds"] = round(time.time() - T0, 1)
        path.write_text(json.dumps(doc, indent=1))
    roof = core.copy_bandwidth("cuda")
    doc["copy_roofline_GBps"] = round(roof, 1)
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    doc["checks"] = check_kernels()
    dump()
    try:
        doc["layer"] = stage_layer(budget, roof)
    except Exception as e:
        doc["layer"] = dict(error=repr(e)[:500])
        traceback.print_exc()
    torch.cuda.empty_cache()
    dump()
    # serving: old, then the fastest checked layer variant (then the next, budget left)
    us = doc["layer"].get("us", {})
    order = sorted((k for k in us if k != "old"), key=us.get)
    doc["serve"] = {}
    for name in ["old"] + order[:2]:
        if left(budget) < (45 if name == "old" or not doc["serve"] else 40):
            doc["serve"][name] = dict(ms_per_step=None, tail="not run (budget)")
            continue
        doc["serve"][name] = serve(name, out_dir, min(60.0, left(budget) - 5))
        dump()
    dump()
    lay = doc["layer"]
    print("\n| variant | layer check | layer µs (x32 ms) | TB/s | serve ms/step |\n"
          "| --- | --- | --- | --- | --- |")
    for k in VARIANTS:
        u = lay.get("us", {}).get(k)
        print(f"| {k} | {lay.get('checks', {}).get(k, '-')[:40]} | "
              f"{u} ({lay.get('per_step_ms_x32', {}).get(k)}) | {lay.get('TBps', {}).get(k)} | "
              f"{doc['serve'].get(k, {}).get('ms_per_step')} |")
    print(f"floor {lay.get('floor_us')} µs/layer at {roof / 1e3:.2f} TB/s, decode splits "
          f"{lay.get('splits')}; gemv chain {lay.get('gemv_chain_us')}")
    bad = [k for k, v in doc["checks"].items() if isinstance(v, str) and v.startswith("FAIL")]
    print(f"kernel checks: {len(bad)} failed {bad}; total {doc['seconds']} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
