"""Lab script for the attention kernels' experiments: launch-config sweeps, kernel-form and
cache-layout comparisons, CUDA-kernel builds with -D variants (JSON into $OUT).

The benchmarks a user runs are in `tskernels-bench`:

    tskernels-bench attention.decode attention.extend mla.decode --modes eager,graph \
        --json-dir $OUT

    python benchmarks/attention_gpu.py sweep            # decode variants, short table
    python benchmarks/attention_gpu.py bench decode     # the same as tskernels-bench above
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

os.environ.setdefault("TSKERNELS_BACKEND", "attention=triton,mla=triton")
OUT = os.environ.get("OUT", "/tmp")


def _save(rows, name):
    """Write a stage's rows to $OUT/$SWEEP_OUT (default: name)."""
    with open(f"{OUT}/{os.environ.get('SWEEP_OUT', name)}", "w") as f:
        json.dump(rows, f, indent=1)


def _time(fn, sets, iters=50, graph=False):
    from tskernels.bench.core import time_fn
    return statistics.median(time_fn(fn, sets, "cuda", iters=iters, graph=graph))


def _decode_shapes():
    """The decode sweeps' (B, L) shapes; SWEEP_SHAPES="1x4096,16x4096" narrows them."""
    if os.environ.get("SWEEP_SHAPES"):
        return [tuple(int(x) for x in s.split("x"))
                for s in os.environ["SWEEP_SHAPES"].split(",")]
    return [(1, 4096), (16, 4096), (64, 4096), (16, 32768), (128, 8192)]


def _decode_runs(sets, fp8, num_splits, configure):
    """One plan per input set (num_splits fixed, then `configure(plan)`), output buffers, and
    the call the timer cycles through them."""
    import tskernels.ops.attention as attn
    plans = [attn.decode_plan(s["pt"], s["lens"], num_q_heads=32, k_cache=s["kc"],
                              q_dtype=torch.bfloat16, num_splits=num_splits,
                              kv_scale_mode="per_tensor" if fp8 else None)
             for s in sets]
    for p in plans:
        configure(p)
    runs = [dict(p=p, s=s, o=torch.empty_like(s["q"])) for p, s in zip(plans, sets)]
    fn = lambda r: r["p"].run(r["s"]["q"], r["s"]["kc"], r["s"]["vc"],  # noqa: E731
                             k_scale=r["s"].get("ks"), v_scale=r["s"].get("vs"), out=r["o"])
    return runs, fn


def _decode_sets(shape, keep_contiguous=False):
    """Input sets for one decode shape (up to 8, ~256 MB rotated past L2), the bytes one call
    reads, fp32 SDPA of set 0 on its contiguous K/V (the accuracy reference) and the plan a
    caller would get (its split count). keep_contiguous: leave each set's contiguous K/V
    copies ("kcont" / "vcont", what SDPA reads) in place."""
    from tskernels.bench.cases.attention import _decode_bytes, _make_decode
    import tskernels.ops.attention as attn
    gen = torch.Generator("cuda").manual_seed(0)
    nbytes = _decode_bytes(shape)
    sets = [_make_decode(shape, "cuda", gen)
            for _ in range(max(1, min(8, (256 << 20) // nbytes)))]
    s0 = sets[0]
    ref = torch.nn.functional.scaled_dot_product_attention(
        s0["q"].float().unsqueeze(2), s0["kcont"].float(), s0["vcont"].float(),
        enable_gqa=True).squeeze(2)
    for s in sets if not keep_contiguous else ():
        del s["kcont"], s["vcont"]
    auto = attn.decode_plan(s0["pt"], s0["lens"], num_q_heads=32, k_cache=s0["kc"],
                            q_dtype=torch.bfloat16,
                            kv_scale_mode="per_tensor" if shape["fp8"] else None)
    return sets, nbytes, ref, auto


def sweep_decode():
    """Time the decode kernel under several (num_splits, BLOCK_N, warps, stages) choices.
    SWEEP_SHAPES="1x4096,16x4096" limits the (B, L) shapes; SWEEP_OUT names the JSON."""
    rows = []
    for fp8, (B, L) in itertools.product((0, 1), _decode_shapes()):
        shape = {"B": B, "L": L, "fp8": fp8}
        sets, nbytes, _, auto = _decode_sets(shape)
        splits = sorted({auto.num_splits, max(1, auto.num_splits // 2), auto.num_splits * 2,
                         *((16, 32, 64) if B == 1 else (2, 4, 6, 8) if B <= 16 else ())})
        best = None
        warps = tuple(int(w) for w in os.environ.get("SWEEP_WARPS", "4,8").split(","))
        stages = tuple(int(w) for w in os.environ.get("SWEEP_STAGES", "2,3,4").split(","))
        for ns, bn, nw, st in itertools.product(splits, (32, 64, 128), warps, stages):
            if bn == 128 and not fp8 and st == 4:
                continue
            def configure(p, bn=bn, nw=nw, st=st):
                p.block_n, p.num_warps, p.num_stages = bn, nw, st
            runs, fn = _decode_runs(sets, fp8, ns, configure)
            try:
                us = _time(fn, runs, iters=30, graph=True)
            except Exception as e:  # out of shared memory etc.
                print("skip", shape, ns, bn, nw, st, type(e).__name__, str(e)[:80])
                continue
            row = dict(shape=shape, splits=ns, block_n=bn, warps=nw, stages=st, us=us,
                       tbps=nbytes / us / 1e6, auto=ns == auto.num_splits)
            rows.append(row)
            if best is None or us < best["us"]:
                best = row
        print(f"BEST {shape} auto_splits={auto.num_splits}: {best}", flush=True)
        del sets
        torch.cuda.empty_cache()
    _save(rows, "attention_decode_sweep.json")


def sweep_decode_modes():
    """Decode kernel forms side by side (graph replay), each checked against the fp32 reference.
    SWEEP_MODES lists "+"-joined tokens: "base" (query heads on the tensor-core M side),
    "keys_m" or "q_fp8x2" (keys on M; with an fp8 cache q is split into two e4m3 terms and K
    feeds e4m3 dots unconverted), "pdl" (the separate merge as a programmatic dependent
    launch), "fused" / "sep" (split-KV merge in the decode kernel / a separate launch; default:
    the plan's policy). SWEEP_SHAPES / SWEEP_SPLITS / SWEEP_BN /
    SWEEP_WARPS / SWEEP_STAGES / SWEEP_FP8 narrow the grid. (Earlier JSONs also name forms
    since removed or made default: "q_fp8" one e4m3 term, "pv_fp8" p and V in e4m3, "ptp" page
    ids one tile ahead, "ef" evict_first on the K/V loads: no measurable change, dropped;
    "vpf" V tiles loaded one iteration ahead into registers by hand: 1.5x slower, dropped.)"""
    from tskernels.numerics import error_stats
    rows = []
    warps = tuple(int(w) for w in os.environ.get("SWEEP_WARPS", "4,8").split(","))
    stages = tuple(int(w) for w in os.environ.get("SWEEP_STAGES", "2,3,4").split(","))
    fp8s = tuple(int(w) for w in os.environ.get("SWEEP_FP8", "0,1").split(","))
    for fp8, (B, L) in itertools.product(fp8s, _decode_shapes()):
        shape = {"B": B, "L": L, "fp8": fp8}
        sets, nbytes, ref, auto = _decode_sets(shape)
        splits = sorted({auto.num_splits, *((16, 32) if B == 1 else (4,) if B <= 16 else ())})
        if os.environ.get("SWEEP_SPLITS"):
            splits = [int(x) for x in os.environ["SWEEP_SPLITS"].split(",")]
        bns = tuple(int(x) for x in os.environ.get("SWEEP_BN", "64,128").split(","))
        modes = tuple(m for m in os.environ.get(
            "SWEEP_MODES", "base+pdl,keys_m+pdl,base,keys_m").split(",")
            if fp8 or "fp8" not in m)
        best = {}
        for mode, ns, bn, nw, st in itertools.product(modes, splits, bns, warps, stages):
            tokens = set(mode.split("+"))

            def configure(p, bn=bn, nw=nw, st=st, tokens=tokens):
                p.block_n, p.num_warps, p.num_stages = bn, nw, st
                p.keys_m = bool(tokens & {"keys_m", "q_fp8x2"})
                p.pdl = p.pdl and "pdl" in tokens
                if "fused" in tokens or "sep" in tokens:
                    p.fused_merge = "fused" in tokens
            runs, fn = _decode_runs(sets, fp8, ns, configure)
            try:
                fn(runs[0])
                err = error_stats(runs[0]["o"], ref)
                us = _time(fn, runs, iters=30, graph=True)
            except Exception as e:  # out of shared memory etc.
                print("skip", shape, mode, ns, bn, nw, st, type(e).__name__, str(e)[:80])
                continue
            row = dict(shape=shape, mode=mode, splits=ns, block_n=bn, warps=nw, stages=st,
                       us=us, tbps=nbytes / us / 1e6, rel_rms=err.rel_rms, rel_max=err.rel_max)
            rows.append(row)
            if mode not in best or us < best[mode]["us"]:
                best[mode] = row
        for mode, r in best.items():
            print(f"MODE B={B:3d} L={L:5d} fp8={fp8} {mode:13s} {r['us']:8.1f} us "
                  f"{r['tbps']:5.2f} TB/s  ns={r['splits']} bn={r['block_n']} w={r['warps']} "
                  f"st={r['stages']}  rms={r['rel_rms']:.2e} max={r['rel_max']:.2e}", flush=True)
        del sets
        torch.cuda.empty_cache()
        _save(rows, "attention_decode_modes.json")


def merge_policy():
    """Fused vs separate split-KV merge under graph replay, per split count (decode, bf16)."""
    from tskernels.bench.cases.attention import _make_decode
    import tskernels.ops.attention as attn
    rows = []
    for (B, L), splits in (((1, 4096), (8, 16, 32)), ((16, 4096), (2, 4, 8))):
        gen = torch.Generator("cuda").manual_seed(0)
        sets = [_make_decode({"B": B, "L": L, "fp8": 0}, "cuda", gen) for _ in range(4)]
        for ns, fused in itertools.product(splits, (True, False)):
            plans = [attn.decode_plan(s["pt"], s["lens"], num_q_heads=32, k_cache=s["kc"],
                                      q_dtype=torch.bfloat16, num_splits=ns) for s in sets]
            for p in plans:
                p.fused_merge = fused
            runs = [dict(p=p, s=s, o=torch.empty_like(s["q"])) for p, s in zip(plans, sets)]
            fn = lambda r: r["p"].run(r["s"]["q"], r["s"]["kc"], r["s"]["vc"],  # noqa: E731
                                     out=r["o"])
            us = _time(fn, runs, iters=50, graph=True)
            rows.append(dict(B=B, L=L, splits=ns, fused=fused, us=us))
            print(f"MERGE B={B} L={L} splits={ns:2d} {'fused   ' if fused else 'separate'} "
                  f"{us:6.1f} us", flush=True)
    with open(f"{OUT}/attention_decode_merge_policy.json", "w") as f:
        json.dump(rows, f, indent=1)


def sweep_extend():
    """Extend launch configs on the prefill / chunk shapes, with the new tokens' K/V read
    contiguously ("contig") and through the page table ("paged"), checked against SDPA and
    timed next to it."""
    from tskernels.bench.cases.attention import (_extend_flops, _make_extend, _prepare_extend,
                                                 _sdpa_extend)
    rows = []
    shapes = ({"N": 4096, "P": 0}, {"N": 16384, "P": 0}, {"N": 1024, "P": 16384})
    if os.environ.get("SWEEP_SHAPES"):  # "4096x0,1024x16384": new tokens x cached prefix
        shapes = [dict(zip(("N", "P"), (int(x) for x in s.split("x"))))
                  for s in os.environ["SWEEP_SHAPES"].split(",")]
    for shape in shapes:
        gen = torch.Generator("cuda").manual_seed(0)
        d = _prepare_extend(_make_extend(shape, "cuda", gen))
        ref = _sdpa_extend(d, d["kcont"], d["vcont"])[0].transpose(0, 1).float()
        sdpa_us = _time(lambda d: _sdpa_extend(d, d["kcont"], d["vcont"]), [d], iters=20)
        flops = _extend_flops(shape)
        print(f"EXT {shape} sdpa {sdpa_us:.1f} us {flops / sdpa_us / 1e6:.0f} TFLOP/s",
              flush=True)
        cfgs = ((128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4),
                (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2))
        if os.environ.get("SWEEP_EXT_CFGS"):  # "128x128x8x3,64x64x4x3"
            cfgs = [tuple(int(x) for x in c.split("x"))
                    for c in os.environ["SWEEP_EXT_CFGS"].split(",")]
        for cfg in cfgs:
            p = d["plan"]
            p.__init__(d["qo"], d["pt"], d["lens"], num_q_heads=32, num_kv_heads=8,
                       head_dim=128, page_size=16, q_dtype=torch.bfloat16,
                       kv_dtype=torch.bfloat16, scale=128 ** -0.5, config=cfg)
            for mode in os.environ.get("SWEEP_EXT_MODES", "contig,paged").split(","):
                kw = dict(k=d["knew"], v=d["vnew"]) if "contig" in mode else {}
                try:
                    o = p.run(d["q"], d["kc"], d["vc"], **kw).float()
                    err = ((o - ref).norm() / ref.norm()).item()
                    us = _time(lambda d: p.run(d["q"], d["kc"], d["vc"], out=d["out"], **kw),
                               [d], iters=20)
                except Exception as e:
                    print("skip", shape, cfg, mode, type(e).__name__, str(e)[:100])
                    continue
                rows.append(dict(shape=shape, cfg=cfg, mode=mode, us=us, err=err,
                                 tflops=flops / us / 1e6, sdpa_us=sdpa_us,
                                 ratio_vs_sdpa=sdpa_us / us))
                r = rows[-1]
                print(f"EXT N={shape['N']} P={shape['P']} {cfg} {mode:12s} {us:8.1f} us "
                      f"{r['tflops']:5.0f} TFLOP/s x{r['ratio_vs_sdpa']:.2f} err {err:.1e}",
                      flush=True)
        del d
        torch.cuda.empty_cache()
    _save(rows, "attention_extend_sweep.json")


def sweep_mla():
    """MLA decode launch configs. SWEEP_MLA_SHAPES="HxBxLxfp8,..." (default 128x64x4096x0,
    128x16x32768x0, 128x64x4096x1, 16x64x4096x0, 16x128x32768x0, 16x64x4096x1) and
    SWEEP_MLA_CFGS="RxNxWxSxK,..." (rows per program, keys per step, warps, stages, fp8 latents
    converted by PTX 0/1; "d" = the plan's default; session-5 JSONs also have a 6th field,
    tiles prefetched into registers by hand, measured slower or equal and dropped);
    SWEEP_SPLITS="0,8" adds split counts (0 = the plan's)."""
    from tskernels.bench.cases.mla import _bytes, _make, _prepare, _torch_bmm
    from tskernels.ops.mla.triton import MLAPlan
    shapes = os.environ.get("SWEEP_MLA_SHAPES", "128x64x4096x0,128x16x32768x0,128x64x4096x1,"
                            "16x64x4096x0,16x128x32768x0,16x64x4096x1")
    cfgs = os.environ.get("SWEEP_MLA_CFGS", "d,64x64x8x2x0,64x64x8x2x1,16x64x4x2x1,16x64x8x2x1,"
                          "16x32x4x3x1,16x64x8x2x0,16x32x4x3x0,32x64x8x2x1")
    splits = [int(x) for x in os.environ.get("SWEEP_SPLITS", "0").split(",")]
    rows = []
    for spec in shapes.split(","):
        h, b, l, f = (int(x) for x in spec.split("x"))
        shape = {"B": b, "L": l, "fp8": f, "H": h}
        gen = torch.Generator("cuda").manual_seed(0)
        d = _prepare(_make(shape, "cuda", gen))
        ref = _torch_bmm(d).float()
        for cfg, ns in itertools.product(cfgs.split(","), splits):
            p = d["plan"]
            kw = {}
            if cfg != "d":
                r, n, w, st, asm = (int(x) for x in cfg.split("x"))
                kw = dict(block_r=r, block_n=n, num_warps=w, num_stages=st, fp8_asm=bool(asm))
            if ns:
                kw["num_splits"] = ns
            if kw:
                p = MLAPlan(p.qo_indptr, d["pt"], d["lens"], num_heads=h, kv_lora_rank=512,
                            rope_dim=64, page_size=64, scale=p.scale, causal=False,
                            max_new_tokens=1, kv_dtype=d["cache"].dtype, **kw)
            try:
                o = p.run(d["q"], d["cache"], kv_scale=d.get("scale")).float()
                err = ((o - ref).norm() / ref.norm()).item()
                us = _time(lambda d: p.run(d["q"], d["cache"], kv_scale=d.get("scale"),
                                           out=d["out"]), [d], iters=20, graph=True)
            except Exception as e:
                print("skip", shape, cfg, type(e).__name__, str(e)[:100])
                continue
            rows.append(dict(shape=shape, cfg=cfg, splits=p.num_splits, us=us, err=err,
                             cfg_used=[p.block_r, p.block_n, p.num_warps, p.num_stages,
                                       int(p.fp8_asm)],
                             tbps=_bytes(shape) / us / 1e6))
            print("MLA", rows[-1], flush=True)
        del d
        torch.cuda.empty_cache()
    with open(f"{OUT}/mla_decode_sweep.json", "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'shape':>22} {'cfg':>14} {'splits':>6} {'us':>9} {'TB/s':>6} {'err':>8}")
    for r in rows:
        s = r["shape"]
        print(f"{s['H']}h B{s['B']} L{s['L']} fp8={s['fp8']:>1} {r['cfg']:>14} {r['splits']:>6} "
              f"{r['us']:9.1f} {r['tbps']:6.2f} {r['err']:8.1e}")


def sweep_cuda():
    """The CUDA fp8 decode (tskernels/ops/attention/cuda_decode.py) against the Triton fp8 and
    bf16 decodes, side by side, graph replay. SWEEP_SHAPES narrows the (B, L) shapes;
    SWEEP_CUDA="WxS,..." (warps x stages) and SWEEP_SPLITS (0 = the plan's) the launches;
    SWEEP_LAYOUT=hnd stores every cache [page, head, slot, dim] (same logical shape, strided)."""
    from tskernels.numerics import error_stats
    from tskernels.ops.attention.cuda_decode import CudaDecodePlan
    cfgs = [tuple(int(x) for x in c.split("x"))
            for c in os.environ.get("SWEEP_CUDA", "4x3,4x2,2x4,8x2,4x4").split(",")]
    splits = [int(x) for x in os.environ.get("SWEEP_SPLITS", "0").split(",")]
    rows = []
    for B, L in _decode_shapes():
        res = {}
        for fp8 in (0, 1):
            shape = {"B": B, "L": L, "fp8": fp8}
            sets, nbytes, ref, auto = _decode_sets(shape)
            if os.environ.get("SWEEP_LAYOUT") == "hnd":  # each head's page slots contiguous
                for st_ in sets:
                    for k in ("kc", "vc"):
                        st_[k] = st_[k].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
            runs, fn = _decode_runs(sets, fp8, auto.num_splits, lambda p: None)
            us = _time(fn, runs, iters=30, graph=True)
            res["triton_bf16" if not fp8 else "triton_fp8"] = us
            rows.append(dict(shape=shape, kernel="triton", splits=auto.num_splits, us=us,
                             tbps=nbytes / us / 1e6))
            if not fp8:
                del sets, runs
                torch.cuda.empty_cache()
                continue
            for (nw, st), ns in itertools.product(cfgs, splits):
                try:
                    plans = [CudaDecodePlan(s["pt"], s["lens"], num_q_heads=32, num_kv_heads=8,
                                            head_dim=128, page_size=s["kc"].shape[1],
                                            q_dtype=torch.bfloat16, kv_dtype=s["kc"].dtype,
                                            scale=128 ** -0.5, num_splits=ns or None,
                                            num_warps=nw, num_stages=st) for s in sets]
                    cr = [dict(p=p, s=s, o=torch.empty_like(s["q"]))
                          for p, s in zip(plans, sets)]
                    cfn = lambda r: r["p"].run(r["s"]["q"], r["s"]["kc"], r["s"]["vc"],  # noqa: E731
                                               k_scale=r["s"]["ks"], v_scale=r["s"]["vs"],
                                               out=r["o"])
                    cfn(cr[0])
                    err = error_stats(cr[0]["o"], ref)
                    us = _time(cfn, cr, iters=30, graph=True)
                except Exception as e:
                    print("skip cuda", shape, nw, st, ns, type(e).__name__, str(e)[:300])
                    continue
                row = dict(shape=shape, kernel=f"cuda {nw}w{st}s", splits=plans[0].num_splits,
                           us=us, tbps=nbytes / us / 1e6, rel_rms=err.rel_rms)
                rows.append(row)
                if us < res.get("cuda", (1e30,))[0]:
                    res["cuda"] = (us, row["kernel"], row["splits"], err.rel_rms)
            del sets, runs
            torch.cuda.empty_cache()
        if "cuda" in res:
            c = res["cuda"]
            print(f"CUDA B={B:3d} L={L:5d}: bf16 triton {res['triton_bf16']:8.1f} us, fp8 triton "
                  f"{res['triton_fp8']:8.1f}, fp8 cuda {c[0]:8.1f} ({c[1]} ns={c[2]} "
                  f"rms={c[3]:.1e}) -> fp8 cuda vs bf16 {res['triton_bf16'] / c[0]:.2f}x, vs "
                  f"fp8 triton {res['triton_fp8'] / c[0]:.2f}x", flush=True)
        _save(rows, "attention_decode_cuda.json")


def _extend_ref(q, k, v, counts, scale):
    """Causal attention per request in fp32 (no prefix): the check for the CUDA prefill."""
    out, s0 = [], 0
    g = q.shape[1] // k.shape[1]
    for n in counts:
        qi = q[s0:s0 + n].float().transpose(0, 1)
        ki = k[s0:s0 + n].float().transpose(0, 1).repeat_interleave(g, 0)
        vi = v[s0:s0 + n].float().transpose(0, 1).repeat_interleave(g, 0)
        out.append(torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, is_causal=True, scale=scale).transpose(0, 1))
        s0 += n
    return torch.cat(out)


def cuda_extend():
    """The CUDA (wgmma) prefill: ragged-batch / GQA / fp16 checks against an fp32 reference,
    then timed side by side with SDPA (contiguous) and the Triton extend at 4k / 16k prefill.
    CUDA_EXTEND_SHAPES="4096,16384" (new tokens, no prefix)."""
    from tskernels.ops.attention import cuda_extend as ce
    from tskernels.bench.cases.attention import (_extend_flops, _make_extend, _prepare_extend,
                                                 _sdpa_extend)
    rows = []
    checks = [([1, 63, 64, 65, 127, 128, 129, 300, 1000], 32, 8, torch.bfloat16),
              ([17, 256, 513], 4, 4, torch.float16), ([2048], 16, 2, torch.bfloat16),
              ([5, 700], 8, 1, torch.float16)]
    for counts, hq, hkv, dt in checks:
        gen = torch.Generator("cuda").manual_seed(1)
        T = sum(counts)
        q = torch.randn(T, hq + 2, 128, device="cuda", dtype=dt, generator=gen)[:, 1:hq + 1]
        k = torch.randn(T, hkv, 128, device="cuda", dtype=dt, generator=gen)
        v = torch.randn(T, hkv, 128, device="cuda", dtype=dt, generator=gen)
        qo = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32,
                          device="cuda")
        lens = torch.tensor(counts, dtype=torch.int32, device="cuda")
        kc = torch.empty(1, 16, hkv, 128, device="cuda", dtype=dt)
        plan = ce.CudaExtendPlan(qo, torch.zeros(len(counts), 1, dtype=torch.int32,
                                                 device="cuda"), lens, num_q_heads=hq,
                                 num_kv_heads=hkv, head_dim=128, page_size=16, q_dtype=dt,
                                 kv_dtype=dt, scale=128 ** -0.5)
        out = torch.full((T, hq, 128), float("nan"), device="cuda", dtype=dt)
        plan.run(q, kc, kc, k=k, v=v, out=out)
        ref = _extend_ref(q, k, v, counts, 128 ** -0.5)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        mx = (out.float() - ref).abs().max().item()
        rows.append(dict(check=dict(counts=counts, hq=hq, hkv=hkv, dtype=str(dt)), rel_err=err,
                         max_abs=mx, nan=bool(out.isnan().any())))
        print(f"CHECK counts={counts} hq={hq} hkv={hkv} {dt}: rel {err:.2e} max {mx:.2e} "
              f"nan={rows[-1]['nan']}", flush=True)
    for N in (int(x) for x in os.environ.get("CUDA_EXTEND_SHAPES", "4096,16384").split(",")):
        shape = {"N": N, "P": 0}
        gen = torch.Generator("cuda").manual_seed(0)
        d = _prepare_extend(_make_extend(shape, "cuda", gen))
        ref = _sdpa_extend(d, d["kcont"], d["vcont"])[0].transpose(0, 1).float()
        cplan = ce.CudaExtendPlan(d["qo"], d["pt"], d["lens"], num_q_heads=32, num_kv_heads=8,
                                  head_dim=128, page_size=16, q_dtype=torch.bfloat16,
                                  kv_dtype=torch.bfloat16, scale=128 ** -0.5)
        kw = dict(k=d["knew"], v=d["vnew"])
        variants = {"default": cplan}
        for var in filter(None, os.environ.get("CUDA_EXTEND_VARIANTS", "").split(";")):
            # "NOPINGPONG", "STAGES=2,BN=64": -D options / launch configs of experiments
            opts = dict(x.split("=") for x in var.split(",") if x.startswith(("STAGES=", "BN=")))
            defs = [x for x in var.split(",") if not x.startswith(("STAGES=", "BN="))]
            st, bn = int(opts.get("STAGES", ce.STAGES)), int(opts.get("BN", ce.BLOCK_N))
            variants[var] = ce.CudaExtendPlan(
                d["qo"], d["pt"], d["lens"], num_q_heads=32, num_kv_heads=8, head_dim=128,
                page_size=16, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                scale=128 ** -0.5, stages=st, block_n=bn, extra=tuple(f"-D{x}" for x in defs))
        # rounds of every variant in turn (CUDA_EXTEND_ROUNDS): a long run heats the GPU and
        # lowers its clock, so a variant timed later in a single pass reads slower
        for rnd in range(int(os.environ.get("CUDA_EXTEND_ROUNDS", "1")) if len(variants) > 1
                         else 0):
            for var, vp in variants.items():
                o = vp.run(d["q"], d["kc"], d["vc"], **kw).float()
                verr = ((o - ref).norm() / ref.norm()).item()
                us = _time(lambda d, vp=vp: vp.run(d["q"], d["kc"], d["vc"], out=d["out"], **kw),
                           [d], iters=20)
                rows.append(dict(shape=shape, variant=var, round=rnd, us=us, err=verr,
                                 tflops=_extend_flops(shape) / us / 1e6))
                print(f"VARIANT N={N} r{rnd} {var:24s} {us:9.1f} us "
                      f"{rows[-1]['tflops']:5.0f} TFLOP/s err {verr:.1e}", flush=True)
        o = cplan.run(d["q"], d["kc"], d["vc"], **kw).float()
        err = ((o - ref).norm() / ref.norm()).item()
        flops = _extend_flops(shape)
        t = {}
        for name, fn in (("sdpa", lambda d: _sdpa_extend(d, d["kcont"], d["vcont"])),
                         ("triton", lambda d: d["plan"].run(d["q"], d["kc"], d["vc"],
                                                            out=d["out"], **kw)),
                         ("cuda", lambda d: cplan.run(d["q"], d["kc"], d["vc"], out=d["out"],
                                                      **kw)),
                         ("sdpa2", lambda d: _sdpa_extend(d, d["kcont"], d["vcont"]))):
            t[name] = _time(fn, [d], iters=20)
        rows.append(dict(shape=shape, us=t, err_cuda=err,
                         tflops={k_: flops / u / 1e6 for k_, u in t.items()},
                         cuda_vs_sdpa=min(t["sdpa"], t["sdpa2"]) / t["cuda"],
                         triton_vs_sdpa=min(t["sdpa"], t["sdpa2"]) / t["triton"]))
        r = rows[-1]
        print(f"PREFILL N={N}: sdpa {t['sdpa']:.1f}/{t['sdpa2']:.1f} us, triton {t['triton']:.1f}, "
              f"cuda {t['cuda']:.1f} ({r['tflops']['cuda']:.0f} TFLOP/s, err {err:.1e}) -> "
              f"cuda/sdpa x{r['cuda_vs_sdpa']:.3f}, triton/sdpa x{r['triton_vs_sdpa']:.3f}",
              flush=True)
        del d
        torch.cuda.empty_cache()
    # the paged variant (every key from the cache) on the bench's shapes, next to SDPA and the
    # Triton extend (CUDA_EXTEND_PAGED="1024x16384,4096x0": new tokens x cached prefix)
    for spec in filter(None, os.environ.get("CUDA_EXTEND_PAGED", "").split(",")):
        N, P = (int(x) for x in spec.split("x"))
        shape = {"N": N, "P": P}
        gen = torch.Generator("cuda").manual_seed(0)
        d = _prepare_extend(_make_extend(shape, "cuda", gen))
        ref = _sdpa_extend(d, d["kcont"], d["vcont"])[0].transpose(0, 1).float()
        pplan = ce.CudaExtendPlan(d["qo"], d["pt"], d["lens"], num_q_heads=32, num_kv_heads=8,
                                  head_dim=128, page_size=16, q_dtype=torch.bfloat16,
                                  kv_dtype=torch.bfloat16, scale=128 ** -0.5, paged=True)
        o = pplan.run(d["q"], d["kc"], d["vc"]).float()
        err = ((o - ref).norm() / ref.norm()).item()
        kw = dict(k=d["knew"], v=d["vnew"])
        t = {name: _time(fn, [d], iters=20) for name, fn in (
            ("sdpa", lambda d: _sdpa_extend(d, d["kcont"], d["vcont"])),
            ("triton", lambda d: d["plan_triton"].run(d["q"], d["kc"], d["vc"], out=d["out"],
                                                      **kw)),
            ("cuda_paged", lambda d: pplan.run(d["q"], d["kc"], d["vc"], out=d["out"])))}
        flops = _extend_flops(shape)
        rows.append(dict(paged_shape=shape, us=t, err=err,
                         tflops={k_: flops / u / 1e6 for k_, u in t.items()}))
        print(f"PAGED N={N} P={P}: sdpa {t['sdpa']:.1f} us, triton {t['triton']:.1f}, cuda_paged "
              f"{t['cuda_paged']:.1f} ({flops / t['cuda_paged'] / 1e6:.0f} TFLOP/s, err "
              f"{err:.1e}) -> x{t['sdpa'] / t['cuda_paged']:.3f} SDPA", flush=True)
        del d
        torch.cuda.empty_cache()
    # ragged batches (serving-like prefill), CUDA vs Triton extend, both as the registry plans
    # them (CUDA_EXTEND_RAGGED="512x1024x...;..." request lengths; heads "hq/hkv" per batch)
    import tskernels.ops.attention as attn
    for spec in filter(None, os.environ.get("CUDA_EXTEND_RAGGED", "").split(";")):
        lens_s, _, heads = spec.partition("@")
        counts = [int(x) for x in lens_s.split("x")]
        hq, hkv = (int(x) for x in (heads or "32/8").split("/"))
        gen = torch.Generator("cuda").manual_seed(2)
        T = sum(counts)
        q = torch.randn(T, hq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(T, hkv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(T, hkv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        qo = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32,
                          device="cuda")
        lens = torch.tensor(counts, dtype=torch.int32, device="cuda")
        # a cache as big as the batch, the new tokens stored in page order (the Triton plan
        # reads only the new tokens' own K/V here, like the CUDA one)
        pages = -(-T // 16) + len(counts)
        kc = torch.zeros(pages, 16, hkv, 128, device="cuda", dtype=torch.bfloat16)
        pt = torch.zeros(len(counts), max(-(-n // 16) for n in counts), dtype=torch.int32,
                         device="cuda")
        nxt = 0
        for b, n in enumerate(counts):
            m = -(-n // 16)
            pt[b, :m] = torch.arange(nxt, nxt + m, dtype=torch.int32)
            nxt += m
        ref = _extend_ref(q, k, v, counts, 128 ** -0.5)
        flops = sum(4 * hq * 128 * n * (n + 1) // 2 for n in counts)
        t = {}
        for name in ("auto", "triton"):
            plan = attn.extend_plan(qo, pt, lens, num_q_heads=hq, k_cache=kc,
                                    q_dtype=torch.bfloat16,
                                    backend=None if name == "auto" else "triton")
            out = torch.empty_like(q)
            o = plan.run(q, kc, kc, k=k, v=v, out=out).float()
            err = ((o - ref).norm() / ref.norm()).item()
            us = _time(lambda d, plan=plan, out=out: plan.run(q, kc, kc, k=k, v=v, out=out),
                       [{}], iters=20)
            t[name] = (us, type(plan).__name__, err)
        rows.append(dict(ragged=counts, heads=[hq, hkv], flops=flops,
                         us={n_: x[0] for n_, x in t.items()},
                         plans={n_: x[1] for n_, x in t.items()},
                         err={n_: x[2] for n_, x in t.items()}))
        print(f"RAGGED {counts} {hq}/{hkv}: {t['auto'][1]} {t['auto'][0]:.1f} us "
              f"({flops / t['auto'][0] / 1e6:.0f} TFLOP/s, err {t['auto'][2]:.1e}), "
              f"{t['triton'][1]} {t['triton'][0]:.1f} us ({flops / t['triton'][0] / 1e6:.0f}) "
              f"-> x{t['triton'][0] / t['auto'][0]:.2f}", flush=True)
    _save(rows, "attention_extend_cuda.json")


def mla_cuda():
    """The CUDA (wgmma) MLA decode next to the Triton kernel and torch bmm, graph replay.
    MLA_CUDA_SHAPES="HxBxL,..." (default 128 heads at B 1 / 16 / 64 / 128, L 4k / 32k, and 64
    heads); MLA_CUDA_SPLITS="0,2" split counts for the CUDA plan (0 = its default);
    MLA_CUDA_VARIANTS="A;B" -D options of experiments (each its own build); MLA_CUDA_SOURCE=FILE
    builds an experimental copy of the kernel source instead of the shipped one."""
    from tskernels.bench.cases.mla import _bytes, _make, _prepare, _torch_bmm
    from tskernels.ops.mla import cuda_decode
    from tskernels.ops.mla.cuda_decode import CudaMLADecodePlan
    from tskernels.ops.mla.triton import MLAPlan
    if os.environ.get("MLA_CUDA_SOURCE"):
        cuda_decode.SOURCE = Path(os.environ["MLA_CUDA_SOURCE"]).resolve()
    shapes = os.environ.get("MLA_CUDA_SHAPES", "128x64x4096,128x128x4096,128x64x32768,"
                            "128x128x32768,128x16x4096,128x16x32768,128x1x4096,64x64x4096")
    splits = [int(x) for x in os.environ.get("MLA_CUDA_SPLITS", "0").split(",")]
    variants = [""] + [v for v in os.environ.get("MLA_CUDA_VARIANTS", "").split(";") if v]
    rows = []
    for spec in shapes.split(","):
        h, b, l, *f = (int(x) for x in spec.split("x"))  # "HxBxL" or "HxBxLx1" (fp8 latents)
        shape = {"B": b, "L": l, "fp8": f[0] if f else 0, "H": h}
        gen = torch.Generator("cuda").manual_seed(0)
        d = _prepare(_make(shape, "cuda", gen))
        ks = d.get("scale")
        ref = _torch_bmm(d).float()
        tp = MLAPlan(torch.arange(b + 1, dtype=torch.int32, device="cuda"), d["pt"], d["lens"],
                     num_heads=h, kv_lora_rank=512, rope_dim=64, page_size=64, scale=d["plan"].scale,
                     causal=False, max_new_tokens=1, kv_dtype=d["cache"].dtype)
        t = {"torch_bmm": _time(lambda d: _torch_bmm(d), [d], iters=20, graph=True),
             "triton": _time(lambda d: tp.run(d["q"], d["cache"], kv_scale=ks, out=d["out"]),
                             [d], iters=20, graph=True)}
        errs = {"triton": ((tp.run(d["q"], d["cache"], kv_scale=ks).float() - ref).norm()
                           / ref.norm()).item()}
        for var in variants:
            for ns in splits:
                name = f"cuda{'[' + var + ']' if var else ''}{'/s' + str(ns) if ns else ''}"
                try:
                    cp = CudaMLADecodePlan(d["pt"], d["lens"], num_heads=h, kv_lora_rank=512,
                                           rope_dim=64, page_size=64, scale=tp.scale,
                                           num_splits=ns or None, kv_dtype=d["cache"].dtype,
                                           extra=tuple(f"-D{x}" for x in var.split(",") if x))
                    o = cp.run(d["q"], d["cache"], kv_scale=ks).float()
                    errs[name] = ((o - ref).norm() / ref.norm()).item()
                    t[name] = _time(lambda d, cp=cp: cp.run(d["q"], d["cache"], kv_scale=ks,
                                                            out=d["out"]),
                                    [d], iters=20, graph=True)
                    errs[name + ":splits"] = cp.num_splits
                except Exception as e:  # noqa: BLE001 - report and go on with the others
                    print("FAIL", spec, name, type(e).__name__, str(e)[:300], flush=True)
        by, fl = _bytes(shape), 2 * b * h * l * (512 + 576)
        rows.append(dict(shape=shape, us=t, err=errs, bytes=by, flops=fl))
        line = " ".join(f"{k} {v:.1f}us({by / v / 1e6:.2f}TB/s,{fl / v / 1e6:.0f}TF)"
                        for k, v in t.items())
        print(f"MLA H={h} B={b} L={l} fp8={shape['fp8']}: {line} err {errs}", flush=True)
        del d
        torch.cuda.empty_cache()
    _save(rows, "mla_decode_cuda.json")


def layout():
    """Cache layout and CUDA-source variants side by side, graph replay, per (B, L) shape:
    SDPA on contiguous bf16 K/V, the Triton bf16 decode and the CUDA fp8 decode on the paged
    cache stored [page, slot, head, dim] ("nhd", the bench's) and [page, head, slot, dim]
    ("hnd": same logical tensor, strided). LAYOUT_SOURCES="v1=FILE;..." adds CUDA fp8 builds
    of other sources; LAYOUT_ROUNDS repeats the whole row set (interleaved, for noise)."""
    from tskernels.numerics import error_stats
    from tskernels.ops.attention import cuda_decode
    sources = [("ship", cuda_decode.SOURCE)] + [
        (n, Path(f).resolve()) for n, _, f in
        (v.partition("=") for v in os.environ.get("LAYOUT_SOURCES", "").split(";") if v)]
    layouts = os.environ.get("LAYOUT_LAYOUTS", "nhd,hnd").split(",")
    rounds = int(os.environ.get("LAYOUT_ROUNDS", "2"))
    rows = []

    def hnd(c):
        return c.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)

    for B, L in _decode_shapes():
        for fp8 in (0, 1):
            shape = {"B": B, "L": L, "fp8": fp8}
            sets, nbytes, ref, _ = _decode_sets(shape, keep_contiguous=True)
            cands = {}
            if not fp8:
                cands["sdpa"] = (lambda s: torch.nn.functional.scaled_dot_product_attention(
                    s["q"].unsqueeze(2), s["kcont"], s["vcont"], enable_gqa=True), sets, None)
            for lay in layouts:
                lsets = sets if lay == "nhd" else [dict(s, kc=hnd(s["kc"]), vc=hnd(s["vc"]))
                                                   for s in sets]
                if not fp8:
                    runs, fn = _decode_runs(lsets, 0, None, lambda p: None)
                    cands[f"triton_bf16_{lay}"] = (fn, runs, runs[0])
                    continue
                for name, src in sources:
                    cuda_decode.SOURCE = src
                    cuda_decode._modules.clear()
                    plans = [cuda_decode.CudaDecodePlan(
                        s["pt"], s["lens"], num_q_heads=32, num_kv_heads=8, head_dim=128,
                        page_size=s["kc"].shape[1], q_dtype=torch.bfloat16,
                        kv_dtype=s["kc"].dtype, scale=128 ** -0.5) for s in lsets]
                    cr = [dict(p=p, s=s, o=torch.empty_like(s["q"]))
                          for p, s in zip(plans, lsets)]
                    cfn = lambda r: r["p"].run(r["s"]["q"], r["s"]["kc"], r["s"]["vc"],  # noqa: E731
                                               k_scale=r["s"]["ks"], v_scale=r["s"]["vs"],
                                               out=r["o"])
                    cands[f"cuda_fp8_{name}_{lay}"] = (cfn, cr, cr[0])
            cuda_decode.SOURCE = sources[0][1]
            cuda_decode._modules.clear()
            errs = {}
            for k, (fn, runs, r0) in cands.items():
                if r0 is not None:
                    fn(r0)
                    errs[k] = error_stats(r0["o"], ref).rel_rms
            for rnd in range(rounds):
                for k, (fn, runs, r0) in cands.items():
                    us = _time(fn, runs, iters=30, graph=True)
                    rows.append(dict(shape=shape, kernel=k, round=rnd, us=us,
                                     tbps=nbytes / us / 1e6, rel_rms=errs.get(k)))
                    print(f"B={B:3d} L={L:5d} fp8={fp8} {k:24s} r{rnd} {us:9.1f} us "
                          f"{nbytes / us / 1e6:5.2f} TB/s rms={errs.get(k, 0):.1e}", flush=True)
            del sets, cands
            torch.cuda.empty_cache()
            _save(rows, "attention_decode_layout.json")


def bench(ops):
    from tskernels.bench.core import run_bench
    for spec in ops:  # "decode" (both modes), "extend:plain" or "mla.decode:graph"
        op, _, mode = spec.partition(":")
        for graph in {"plain": (False,), "graph": (True,)}.get(mode, (False, True)):
            res = run_bench(f"attention.{op}" if "." not in op else op, graph=graph, iters=30)
            tag = op.replace(".", "_") + ("_graph" if graph else "")
            with open(f"{OUT}/{tag}.json", "w") as f:
                json.dump(res, f, indent=1)
            from tskernels.bench.cli import _table
            print(_table(res), flush=True)


if __name__ == "__main__":
    stage = sys.argv[1]
    if stage == "sweep":
        sweep_decode()
    elif stage == "modes":
        sweep_decode_modes()
    elif stage == "merge_policy":
        merge_policy()
    elif stage == "sweep_extend":
        sweep_extend()
    elif stage == "sweep_cuda":
        sweep_cuda()
    elif stage == "cuda_extend":
        cuda_extend()
    elif stage == "mla_cuda":
        mla_cuda()
    elif stage == "sweep_mla":
        sweep_mla()
    elif stage == "layout":
        layout()
    elif stage == "bench":
        bench(sys.argv[2:])
