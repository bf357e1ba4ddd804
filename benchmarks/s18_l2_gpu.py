"""L2 prefetch of a decode layer's weights on a side branch (issue 24's B = 1 target): one
Llama-3-8B decode layer at B = 1 as serving runs it (fused add + RMSNorm, qkv gemv, the fused
RoPE + K/V store, split-KV decode + merge, o gemv, add + RMSNorm, gate-up gemv, SiLU-mul, down
gemv), with `tskernels.gemm.prefetch_weights` branches at several places:

    PYTHONPATH=$PWD python benchmarks/s18_l2_gpu.py $OUT [budget_s, default 150]

Variants (fork = the branch starts after everything enqueued so far; join = the next gemv waits):
- base: no prefetch (what ships);
- o: the whole o_proj (32 MB) forked after the qkv gemv, joined before the o gemv;
- o_late: the same forked after the RoPE + store launch;
- o_inline / o_inline_rope: the prefetch launched on the main stream after the qkv gemv / the
  RoPE + store (what follows waits for it);
- o_bulk / o_bulk_early: a chained (PDL) launch after the qkv gemv issuing 32 KB
  cp.async.bulk.prefetch.L2 per thread after / before waiting for the qkv gemv;
- o+gu2: o, plus gate-up's first 2 tiles per program forked after the attention (so they
  load while the o gemv reads L2), joined before the gate-up gemv;
- o+gu2+dn2: and down's first 2 tiles per program forked after the gate-up gemv.
Every variant is first checked equal to base (eager, and a replayed CUDA graph with NaN-
poisoned outputs). Timing: back-to-back layers in one graph cycling through 4 weight copies
(436 MB each), median µs per layer; the copy roofline of the same process. JSON:
$OUT/s18_l2.json; a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 4096, 32, 8, 128, 14336
PAGE, SEQ, MAX_LEN = 64, 152, 1024
DEV, DTYPE = "cuda", torch.bfloat16
T0 = time.time()
# name: (o fork point None / "qkv" / "rope", gate-up tiles, down tiles)
VARIANTS = {
    "base": (None, 0, 0),
    "o": ("qkv", 0, 0),
    "o_late": ("rope", 0, 0),
    "o_inline": ("inline", 0, 0),
    "o_inline_rope": ("inline_rope", 0, 0),
    "o_bulk": ("bulk", 0, 0),
    "o_bulk_early": ("bulk_early", 0, 0),
    "o+gu2": ("qkv", 2, 0),
    "o+gu2+dn2": ("qkv", 2, 2),
}


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def _rnd(g, *shape, scale=1.0):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(DTYPE)


def make(g):
    import tskernels
    from tskernels.ops.shared import l2
    pages = MAX_LEN // PAGE + 1
    kc, vc = _rnd(g, pages, PAGE, KV_HEADS, HEAD_DIM), _rnd(g, pages, PAGE, KV_HEADS, HEAD_DIM)
    perm = torch.randperm(pages, device=DEV, generator=g)
    page_table = perm[None, :MAX_LEN // PAGE].to(torch.int32).contiguous()
    seq_lens = torch.tensor([SEQ], dtype=torch.int32, device=DEV)
    plan = tskernels.attention.decode_plan(page_table, seq_lens, num_q_heads=HEADS, k_cache=kc,
                                           max_seq_len=MAX_LEN)
    last = SEQ - 1
    slot = (page_table[0, last // PAGE].long() * PAGE + last % PAGE).view(1)
    pos = torch.tensor([last], device=DEV)
    cache = tskernels.rope.cos_sin_cache(4096, HEAD_DIM, 500000.0, device=DEV)
    x, res = _rnd(g, 1, HIDDEN), _rnd(g, 1, HIDDEN)
    q_n, kv_n = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    gemm = tskernels.gemm
    cfg = {"v": VARIANTS["base"]}

    def layer(w):
        o_at, gu_t, dn_t = cfg["v"]
        h, r = tskernels.norm.fused_add_rmsnorm(x, res, w["ln1"], 1e-5)
        qkv = gemm.gemv(h, w["qkv"])
        pf_o = gemm.prefetch_weights(w["o"]) if o_at == "qkv" else None
        if o_at == "inline":  # on the main stream: the next launches wait for it
            l2.launch(w["o"])
        if o_at in ("bulk", "bulk_early"):  # chained bulk prefetch on the main stream
            l2.launch_bulk(w["o"], early=o_at == "bulk_early")
        q, k, v = qkv.split([q_n, kv_n, kv_n], dim=-1)
        q = tskernels.attention.rope_store_kv(
            q.view(1, HEADS, HEAD_DIM), k.view(1, KV_HEADS, HEAD_DIM),
            v.view(1, KV_HEADS, HEAD_DIM), pos, cache, kc, vc, slot)
        if o_at == "rope":
            pf_o = gemm.prefetch_weights(w["o"])
        if o_at == "inline_rope":
            l2.launch(w["o"])
        a = plan.run(q, kc, vc).view(1, -1)
        pf_gu = gemm.prefetch_weights(w["gu"], tiles=gu_t) if gu_t else None
        if pf_o is not None:
            pf_o.join()
        o = gemm.gemv(a, w["o"])
        h, r = tskernels.norm.fused_add_rmsnorm(o, r, w["ln2"], 1e-5)
        if pf_gu is not None:
            pf_gu.join()
        gu = gemm.gemv(h, w["gu"])
        pf_dn = gemm.prefetch_weights(w["down"], tiles=dn_t) if dn_t else None
        act = tskernels.activation.silu_and_mul(gu)
        if pf_dn is not None:
            pf_dn.join()
        return gemm.gemv(act, w["down"]), r
    return layer, cfg


def weights(g) -> dict:
    return dict(qkv=_rnd(g, (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, scale=HIDDEN ** -0.5),
                o=_rnd(g, HIDDEN, HEADS * HEAD_DIM, scale=(HEADS * HEAD_DIM) ** -0.5),
                gu=_rnd(g, 2 * INTER, HIDDEN, scale=HIDDEN ** -0.5),
                down=_rnd(g, HIDDEN, INTER, scale=INTER ** -0.5),
                ln1=1 + _rnd(g, HIDDEN, scale=0.1), ln2=1 + _rnd(g, HIDDEN, scale=0.1))


def check(layer, w, want, name):
    """Equal to the base variant within bf16 tolerance (the split-K gemvs add their fp32
    partials in arrival order, so two runs of one variant differ in the last bits)."""
    from tskernels.numerics import assert_close
    got = layer(w)
    for a, b in zip(got, want):
        assert_close(a, b.double(), dtype=DTYPE, name=f"{name} eager")
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


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
    from tskernels.bench import core
    from tskernels.ops.shared import l2
    res = {"command": "python benchmarks/s18_l2_gpu.py $OUT " + str(int(budget)),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(), "checks": {}, "us": {}}
    res["copy_TBps"] = round(core.copy_bandwidth("cuda") / 1e3, 3)
    g = torch.Generator(device=DEV).manual_seed(3)
    layer, cfg = make(g)
    sets = [weights(g) for _ in range(4)]
    w0 = sets[0]
    from tskernels.ops.gemm import triton_gemv
    res["prefetch_MB"] = {
        "o": l2.nbytes(w0["o"]) / 1e6,
        "gu2": l2.nbytes(w0["gu"], *triton_gemv.first_tiles(1, w0["gu"], 2)) / 1e6,
        "dn2": l2.nbytes(w0["down"], *triton_gemv.first_tiles(1, w0["down"], 2)) / 1e6}
    wbytes = sum(t.numel() * 2 for t in w0.values())
    res["weight_MB"] = round(wbytes / 1e6, 1)
    want = [t.clone() for t in layer(w0)]
    for name, v in VARIANTS.items():
        if left(budget) < 20:
            res["checks"][name] = "not run (budget)"
            continue
        cfg["v"] = v
        try:
            check(layer, w0, want, name)
            res["checks"][name] = "ok"
            res["us"][name] = [round(statistics.median(
                core.time_fn(layer, sets, "cuda", iters=80, graph=True)), 2) for _ in range(2)]
        except Exception as e:  # noqa: BLE001
            res["checks"][name] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        print(f"{name}: {res['checks'][name]} {res['us'].get(name)}", flush=True)
    cfg["v"] = VARIANTS["base"]
    # the o gemv alone: weights rotated past L2 vs one L2-resident copy; the prefetch alone
    if left(budget) > 15:
        a = _rnd(g, 1, HEADS * HEAD_DIM)
        gemv = __import__("tskernels").gemm.gemv
        res["o_gemv_us"] = {
            "rotated": round(statistics.median(core.time_fn(
                lambda w: gemv(a, w["o"]), sets, "cuda", iters=200, graph=True)), 2),
            "l2_hot": round(statistics.median(core.time_fn(
                lambda w: gemv(a, w["o"]), [w0], "cuda", iters=200, graph=True)), 2),
            "prefetch_kernel_rotated": round(statistics.median(core.time_fn(
                lambda w: l2.launch(w["o"]), sets, "cuda", iters=200, graph=True)), 2),
            "bulk_kernel_rotated": round(statistics.median(core.time_fn(
                lambda w: l2.launch_bulk(w["o"]), sets, "cuda", iters=200, graph=True)), 2),
            "bulk_then_gemv_rotated": round(statistics.median(core.time_fn(
                lambda w: (l2.launch_bulk(w["o"]), gemv(a, w["o"])), sets, "cuda", iters=200,
                graph=True)), 2)}
        print(f"o gemv alone: {res['o_gemv_us']}", flush=True)
    # base again at the end (drift)
    if left(budget) > 10:
        res["us"]["base_again"] = [round(statistics.median(
            core.time_fn(layer, sets, "cuda", iters=80, graph=True)), 2)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "s18_l2.json").write_text(json.dumps(res, indent=2))
    print(f"\nprefetch MB {res['prefetch_MB']}, layer weights {res['weight_MB']} MB, "
          f"copy {res['copy_TBps']} TB/s")
    print(f"{'variant':<12} {'check':<6} us/layer (x32 ms)")
    for name in list(VARIANTS) + ["base_again"]:
        us = res["us"].get(name)
        ms = f"{statistics.median(us) * 32 / 1e3:.3f}" if us else "-"
        print(f"{name:<12} {res['checks'].get(name, ''):<6.6} {us} ({ms})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
