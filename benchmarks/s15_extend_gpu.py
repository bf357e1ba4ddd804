"""Lab script (issue 20, the later turn's TTFT): split-KV and GQA packing in the CUDA paged
extend (attention.extend.cuda_paged, plan options `splits`, `gqa_pack`), old launch (splits=1,
no packing) vs new in one process: "new" = splits chosen by the plan, "pack" = GQA packing with
splits chosen, "pack1" = packing unsplit, "sN" = N forced splits (unpacked).

Stage 1: the GPU tests of the paged extend (the split / pack tests first, then the rest),
each under a timeout. Stage 2 (a child process under a timeout, so a hung kernel cannot eat the
budget): Llama-3-8B's attention shape (32 q heads, 8 KV heads, head dim 128, bf16, 16-slot
pages, permuted page table) for one layer: 50,800 cached + 800 new, 51,000 + 16, 51,000 + 128,
a 4-request batch, and a plain 4k prefill (no prefix: must not regress). CUDA-graph replay
(tskernels.bench.core.time_fn), medians; the 4k prefill rotates 3 input sets (> L2), the long
prefixes' caches alone are 4x L2. Per shape: us, TFLOP/s (causal FLOPs actually needed), the
split count, max |x - old| and each against an fp32 reference (the 4k prefill's reference is
fp32 SDPA). JSON: $OUT/s15_extend.json; a short table last.

    python benchmarks/s15_extend_gpu.py $OUT 140        # OUT, total seconds budget
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo (also without the preamble's PYTHONPATH)
TESTS = "tests/kernels/test_attention_cuda_paged_extend.py"
HQ, HKV, D, PAGE = 32, 8, 128, 16
DEV = "cuda"
SHAPES = [  # (name, cached prefixes, new tokens)
    ("later_turn_50.8k+800", [50800], [800]),
    ("followup_51k+16", [51000], [16]),
    ("followup_51k+128", [51000], [128]),
    ("batch4", [50800, 51000, 30000, 8000], [800, 16, 128, 512]),
    ("prefill_4k", [0], [4096]),
]
FORCED = (2, 4, 8, 16)  # extra split counts timed on the single-request long-prefix shapes


def _pytest(args, limit) -> dict:
    """pytest -m gpu over TESTS under a timeout; 4 xdist workers when xdist is there (the
    float64 references run on the host), each with 4 CPU threads."""
    import importlib.util
    t0 = time.time()
    if importlib.util.find_spec("xdist"):
        args = ["-n", "4", *args]
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfE",
                            "-p", "no:cacheprovider", TESTS, *args], capture_output=True,
                           text=True, timeout=limit, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "4"})
        tail, rc = (p.stdout + p.stderr)[-1500:], p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = _text(e.stdout)[-1500:], "timeout"
    print(f"pytest {' '.join(args)}: rc {rc} in {time.time() - t0:.0f} s\n{tail[-600:]}",
          flush=True)
    return dict(args=args, rc=rc, seconds=round(time.time() - t0, 1), tail=tail)


def _text(x) -> str:
    """A timed-out child's captured output (bytes even with text=True)."""
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _problem(prefixes, news, gen, sets):
    import torch
    lens = [p + n for p, n in zip(prefixes, news)]
    pages = [-(-L // PAGE) for L in lens]
    total = sum(pages)
    perm = torch.randperm(total, generator=gen).to(DEV, torch.int32)
    pt = torch.zeros(len(lens), max(pages), dtype=torch.int32, device=DEV)
    at = 0
    for b, n in enumerate(pages):
        pt[b, :n] = perm[at:at + n]
        at += n
    indptr = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32,
                          device=DEV)
    out = []
    for _ in range(sets):
        kc = torch.randn(total, PAGE, HKV, D, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn(total, PAGE, HKV, D, device=DEV, dtype=torch.bfloat16)
        q = torch.randn(sum(news), HQ, D, device=DEV, dtype=torch.bfloat16)
        out.append(dict(q=q, kc=kc, vc=vc, out=torch.empty_like(q)))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    return indptr, pt, seq, out


def _reference(d, indptr, pt, seq):
    """fp32 causal attention per request and KV head (keys gathered through the page table)."""
    import torch
    ref = torch.empty(d["q"].shape, dtype=torch.float32, device=DEV)
    ptr, lens = indptr.tolist(), seq.tolist()
    for b, L in enumerate(lens):
        n = ptr[b + 1] - ptr[b]
        if n == 0:
            continue
        pages = pt[b, :-(-L // PAGE)].long()
        k = d["kc"][pages].reshape(-1, HKV, D)[:L].float()
        v = d["vc"][pages].reshape(-1, HKV, D)[:L].float()
        pos = torch.arange(L - n, L, device=DEV)
        mask = torch.arange(L, device=DEV)[None, :] > pos[:, None]
        g = HQ // HKV
        for h in range(HKV):
            qh = d["q"][ptr[b]:ptr[b + 1], h * g:(h + 1) * g].float().transpose(0, 1)
            s = (qh @ k[:, h].T) * D ** -0.5
            s.masked_fill_(mask, float("-inf"))
            ref[ptr[b]:ptr[b + 1], h * g:(h + 1) * g] = (s.softmax(-1) @ v[:, h]).transpose(0, 1)
    return ref


def _flops(prefixes, news) -> float:
    return sum(4 * HQ * D * sum(p + i + 1 for i in range(n)) for p, n in zip(prefixes, news))


def stage2(out_dir: str, deadline: float) -> int:
    """Time every shape's variants until `deadline` (time.time() seconds)."""
    import torch

    from tskernels.bench.core import time_fn
    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    rows = []
    gen = torch.Generator().manual_seed(0)
    for name, prefixes, news in SHAPES:
        if time.time() > deadline - 8:
            rows.append(dict(shape=name, skipped="time budget"))
            continue
        sets = 3 if max(prefixes) == 0 else 1
        indptr, pt, seq, data = _problem(prefixes, news, gen, sets)
        mk = lambda s, pk=False: CudaExtendPlan(  # noqa: E731
            indptr, pt, seq, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE,
            q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, scale=D ** -0.5, paged=True,
            splits=s, gqa_pack=pk)
        plans = {"old": mk(1), "new": mk(None), "pack": mk(None, True), "pack1": mk(1, True)}
        if len(news) == 1 and prefixes[0] > 0:
            for s in FORCED:
                plans[f"s{s}"] = mk(s)
        flops = _flops(prefixes, news)
        ref = _reference(data[0], indptr, pt, seq)
        outs, row = {}, dict(shape=name, prefixes=prefixes, new=news,
                             gflop=round(flops / 1e9, 1), variants={})
        for key, plan in plans.items():
            try:
                o = plan.run(data[0]["q"], data[0]["kc"], data[0]["vc"])
                torch.cuda.synchronize()
                outs[key] = o.float()
                us = sorted(time_fn(lambda d, p=plan: p.run(d["q"], d["kc"], d["vc"],
                                                            out=d["out"]),
                                    data, "cuda", iters=20, graph=True))
            except Exception as e:  # recorded; the other variants still run
                row["variants"][key] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
                continue
            med = us[len(us) // 2]
            row["variants"][key] = dict(
                splits=plan.splits, gqa_pack=plan.gqa_pack,
                ctas=plan.num_blocks * plan.ctas_per_item, us=round(med, 1),
                tflops=round(flops / med / 1e6, 1),
                max_abs_vs_old=float((outs[key] - outs["old"]).abs().max())
                if "old" in outs else None,
                max_abs_vs_fp32=float((outs[key] - ref).abs().max()),
                finite=bool(torch.isfinite(outs[key]).all()))
            if time.time() > deadline - 5:
                break
        v = row["variants"]
        for key in ("new", "pack"):
            if "us" in v.get(key, {}) and "us" in v.get("old", {}):
                row[f"speedup_{key}_vs_old"] = round(v["old"]["us"] / v[key]["us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(out_dir, "s15_extend_timing.json"), "w") as f:
            json.dump(rows, f, indent=1)  # kept when a later shape runs out of time
        del data, outs, ref, plans
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "s15_extend_timing.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 140.0
    if len(sys.argv) > 3 and sys.argv[3] == "--stage2":
        return stage2(out_dir, budget)
    t0 = time.time()
    stale = os.path.join(out_dir, "s15_extend_timing.json")
    if os.path.exists(stale):  # an earlier run's rows must not pass for this run's
        os.remove(stale)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               command=f"python benchmarks/s15_extend_gpu.py $OUT {budget:g}")
    res["tests_split"] = _pytest(["-k", "(split or pack) and not property"], min(62, budget * 0.44))
    # the unsplit launch's deterministic tests (its cubin is unchanged by the split build)
    res["tests_rest"] = _pytest(["-k", "edges or named"], min(22, budget * 0.16))
    left = budget - (time.time() - t0) - 3
    try:
        p = subprocess.run([sys.executable, __file__, out_dir, str(time.time() + left),
                            "--stage2"], timeout=left, capture_output=True, text=True)
        res["timing_rc"], log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        res["timing_rc"], log = "timeout", _text(e.stdout)
    res["timing_log_tail"] = log[-2000:]
    path = os.path.join(out_dir, "s15_extend_timing.json")
    res["rows"] = json.load(open(path)) if os.path.exists(path) else []
    with open(os.path.join(out_dir, "s15_extend.json"), "w") as f:
        json.dump(res, f, indent=1)
    if res["timing_rc"] != 0:
        print(log[-1500:])
    print(f"tests: split rc {res['tests_split']['rc']}, rest rc {res['tests_rest']['rc']}; "
          f"timing rc {res['timing_rc']}; {time.time() - t0:.0f} s")
    print("us (split count) TFLOP/s; err = max |x - fp32 ref| over old / new / pack / pack1")
    print(f"{'shape':<21}{'old':>14}{'new':>14}{'pack':>14}{'pack1':>14}  err  forced us")
    for r in res["rows"]:
        v = r.get("variants", {})
        if "pack1" not in v:
            print(f"{r['shape']:<21} {r.get('skipped', 'incomplete')}")
            continue
        cell = lambda x: f"{x['us']:.0f}({x['splits']}){x['tflops']:.0f}" \
            if "us" in x else "error"  # noqa: E731
        err = max((v[k]["max_abs_vs_fp32"] for k in ("old", "new", "pack", "pack1")
                   if "us" in v[k]), default=float("nan"))
        forced = " ".join(f"{k[1:]}:{x['us']:.0f}" for k, x in v.items()
                          if k[0] == "s" and "us" in x)
        print(f"{r['shape']:<21}" + "".join(f"{cell(v[k]):>14}" for k in
                                            ("old", "new", "pack", "pack1")) +
              f"  {err:.0e}  {forced}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
