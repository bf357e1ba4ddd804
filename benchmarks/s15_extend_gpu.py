"""Lab script (issue 20, the later turn's TTFT): split-KV and GQA packing in the CUDA paged
extend (attention.extend.cuda_paged, plan options `splits`, `gqa_pack`), old launch (splits=1,
no packing) vs new in one process: "new" = splits chosen by the plan, "pack" = GQA packing with
splits chosen, "pack1" = packing unsplit, "sN" = N forced splits (unpacked).

Stage 1: the GPU tests of the paged extend (the split / pack tests first, then the unsplit
launch's edges), each under a timeout, verbose (a timed-out run still shows which tests
passed); each stage's full output goes to $OUT/s15_extend_pytest_<stage>.log, its failures'
short summaries (-rfE) into the JSON. Stage 2 (a child process under a timeout, so a hung
kernel cannot eat the budget; its output: $OUT/s15_extend_timing.log): Llama-3-8B's
attention shape (32 q heads, 8 KV heads, head dim 128, bf16, 16-slot pages, permuted page
table) for one layer: 50,800 cached + 800 new, 51,000 + 16, 51,000 + 128,
a 4-request batch, and a plain 4k prefill (no prefix: must not regress). CUDA-graph replay
(tskernels.bench.core.time_fn), medians; the 4k prefill rotates 3 input sets (> L2), the long
prefixes' caches alone are 4x L2. Per shape: us, TFLOP/s (causal FLOPs actually needed), the
split count, max |x - old| and each against an fp32 reference (gathered through the page
table). Then a page-size experiment: old and pack (auto split) on the later turn and the
16-token follow-up at 16-, 64- and 128-slot pages (the kernel's TMA boxes are min(page, 128)
rows: 16-slot pages issue 8x the boxes and page-table lookups of 128-slot ones; is that the
gap to the contiguous kernel?). JSON: $OUT/s15_extend.json; short tables last.

    python benchmarks/s15_extend_gpu.py $OUT 140        # OUT, total seconds budget
"""
from __future__ import annotations

import json
import os
import signal
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
PAGE_SHAPES = ("later_turn_50.8k+800", "followup_51k+16")  # the page-size experiment's
PAGE_SIZES = (16, 64, 128)


def _pytest(stage, args, limit, out_dir, workers) -> dict:
    """pytest -m gpu over TESTS under a timeout, verbose; `workers` xdist workers when xdist
    is there (each compiles its own kernels: NVRTC, CPU-bound, 16 cores; the float64
    references run on the host), 16 / workers CPU threads each. The whole output ->
    $OUT/s15_extend_pytest_<stage>.log; the JSON keeps the FAILED / ERROR summary lines, the
    passed / failed counts and a short tail."""
    import importlib.util
    t0 = time.time()
    if importlib.util.find_spec("xdist"):
        args = ["-n", str(workers), *args]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "--tb=short",
           "-p", "no:cacheprovider", TESTS, *args]
    # its own process group: on a timeout the xdist workers go too (left running, they would
    # share the GPU with the timing stage)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(16 // workers)},
                         start_new_session=True)
    try:
        text, rc = p.communicate(timeout=limit)[0], p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, rc = p.communicate()[0], "timeout"
    log = os.path.join(out_dir, f"s15_extend_pytest_{stage}.log")
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n(rc {rc}, {time.time() - t0:.1f} s)\n{text}")
    lines = text.splitlines()
    failures = [x for x in lines if x.startswith(("FAILED ", "ERROR "))]
    per_test = [x for x in lines if "::" in x and not x.startswith(("FAILED ", "ERROR "))]
    counts = {k: sum(f" {k.upper()} " in f" {x} " for x in per_test)
              for k in ("passed", "failed", "error")}  # verbose per-test lines (xdist: [gwN])
    tail = "\n".join(x for x in lines if "PytestBenchmarkWarning" not in x and
                     "warner(" not in x)[-1500:]
    print(f"pytest {' '.join(args)}: rc {rc} in {time.time() - t0:.0f} s, {counts}; "
          f"log {log}\n" + "\n".join(failures[:20]), flush=True)
    return dict(args=args, rc=rc, seconds=round(time.time() - t0, 1), counts=counts,
                failures=failures, log=os.path.basename(log), tail=tail)


def _text(x) -> str:
    """A timed-out child's captured output (bytes even with text=True)."""
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _problem(prefixes, news, gen, sets, page=PAGE):
    import torch
    lens = [p + n for p, n in zip(prefixes, news)]
    pages = [-(-L // page) for L in lens]
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
        kc = torch.randn(total, page, HKV, D, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn(total, page, HKV, D, device=DEV, dtype=torch.bfloat16)
        q = torch.randn(sum(news), HQ, D, device=DEV, dtype=torch.bfloat16)
        out.append(dict(q=q, kc=kc, vc=vc, out=torch.empty_like(q)))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    return indptr, pt, seq, out


def _reference(d, indptr, pt, seq, page=PAGE):
    """fp32 causal attention per request and KV head (keys gathered through the page table)."""
    import torch
    ref = torch.empty(d["q"].shape, dtype=torch.float32, device=DEV)
    ptr, lens = indptr.tolist(), seq.tolist()
    for b, L in enumerate(lens):
        n = ptr[b + 1] - ptr[b]
        if n == 0:
            continue
        pages = pt[b, :-(-L // page)].long()
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


def _time_variants(plans, data, ref, flops) -> dict:
    """Each plan's first output (vs the "old" plan's and the fp32 reference) and its
    graph-replay median; a failing variant is recorded and the others still run."""
    import torch

    from tskernels.bench.core import time_fn
    outs, res = {}, {}
    for key, plan in plans.items():
        try:
            o = plan.run(data[0]["q"], data[0]["kc"], data[0]["vc"])
            torch.cuda.synchronize()
            outs[key] = o.float()
            us = sorted(time_fn(lambda d, p=plan: p.run(d["q"], d["kc"], d["vc"], out=d["out"]),
                                data, "cuda", iters=20, graph=True))
        except Exception as e:
            res[key] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
            continue
        med = us[len(us) // 2]
        res[key] = dict(
            splits=plan.splits, gqa_pack=plan.gqa_pack, ctas=plan.num_blocks * plan.ctas_per_item,
            us=round(med, 1), tflops=round(flops / med / 1e6, 1),
            max_abs_vs_old=float((outs[key] - outs["old"]).abs().max()) if "old" in outs
            else None,
            max_abs_vs_fp32=float((outs[key] - ref).abs().max()),
            finite=bool(torch.isfinite(outs[key]).all()))
    return res


def stage2(out_dir: str, deadline: float) -> int:
    """Time every shape's variants, then the page-size experiment, until `deadline`
    (time.time() seconds); rows saved after each shape."""
    import torch

    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    rows, path = [], os.path.join(out_dir, "s15_extend_timing.json")
    gen = torch.Generator().manual_seed(0)
    runs = [(name, pre, new, PAGE, False) for name, pre, new in SHAPES] + \
        [(name, pre, new, page, True) for page in PAGE_SIZES
         for name, pre, new in SHAPES if name in PAGE_SHAPES]
    for name, prefixes, news, page, page_exp in runs:
        label = f"{name}@page{page}" if page_exp else name
        if time.time() > deadline - 8:
            rows.append(dict(shape=label, page_size=page, page_experiment=page_exp,
                             skipped="time budget"))
            continue
        sets = 3 if max(prefixes) == 0 else 1
        indptr, pt, seq, data = _problem(prefixes, news, gen, sets, page)
        mk = lambda s, pk=False: CudaExtendPlan(  # noqa: E731
            indptr, pt, seq, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=page,
            q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, scale=D ** -0.5, paged=True,
            splits=s, gqa_pack=pk)
        plans = {"old": mk(1), "pack": mk(None, True)}
        if not page_exp:
            plans = {"old": plans["old"], "new": mk(None), "pack": plans["pack"],
                     "pack1": mk(1, True)}
            if len(news) == 1 and prefixes[0] > 0:
                for s in FORCED:
                    plans[f"s{s}"] = mk(s)
        flops = _flops(prefixes, news)
        ref = _reference(data[0], indptr, pt, seq, page)
        row = dict(shape=label, page_size=page, page_experiment=page_exp, prefixes=prefixes,
                   new=news, gflop=round(flops / 1e9, 1),
                   variants=_time_variants(plans, data, ref, flops))
        v = row["variants"]
        for key in ("new", "pack"):
            if "us" in v.get(key, {}) and "us" in v.get("old", {}):
                row[f"speedup_{key}_vs_old"] = round(v["old"]["us"] / v[key]["us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)  # kept when a later shape runs out of time
        del data, ref, plans
        torch.cuda.empty_cache()
    with open(path, "w") as f:
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
    # the split / pack tests (8 workers: each NVRTC-compiles its kernel builds), then the
    # unsplit launch's deterministic tests (its cubin is unchanged by the split build)
    res["tests_split"] = _pytest("split", ["-k", "(split or pack) and not property"],
                                 min(60, budget * 0.43), out_dir, 8)
    res["tests_rest"] = _pytest("rest", ["-k", "edges or named"], min(35, budget * 0.25),
                                out_dir, 4)
    left = budget - (time.time() - t0) - 3
    try:
        p = subprocess.run([sys.executable, __file__, out_dir, str(time.time() + left),
                            "--stage2"], timeout=left, capture_output=True, text=True)
        res["timing_rc"], log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        res["timing_rc"], log = "timeout", _text(e.stdout) + _text(e.stderr)
    with open(os.path.join(out_dir, "s15_extend_timing.log"), "w") as f:
        f.write(log)
    res["timing_log_tail"] = log[-2000:]
    path = os.path.join(out_dir, "s15_extend_timing.json")
    res["rows"] = json.load(open(path)) if os.path.exists(path) else []
    with open(os.path.join(out_dir, "s15_extend.json"), "w") as f:
        json.dump(res, f, indent=1)
    if res["timing_rc"] != 0:
        print(log[-1500:])
    _table(res, time.time() - t0)
    return 0


def _table(res: dict, seconds: float) -> None:
    tests = {k: res[k] for k in ("tests_split", "tests_rest")}
    print("; ".join(f"{k}: rc {t['rc']} {t['counts']}" for k, t in tests.items()) +
          f"; timing rc {res['timing_rc']}; {seconds:.0f} s")
    for t in tests.values():
        for line in t["failures"][:12]:
            print("  " + line[:160])
    cell = lambda x: f"{x['us']:.0f}({x['splits']}){x['tflops']:.0f}" \
        if "us" in x else "error" if x else "-"  # noqa: E731
    print("us (split count) TFLOP/s; err = max |x - fp32 ref| over the variants shown")
    print(f"{'shape':<27}{'old':>14}{'new':>14}{'pack':>14}{'pack1':>14}  err  forced us")
    for r in res["rows"]:
        v = r.get("variants", {})
        if not v:
            print(f"{r['shape']:<27} {r.get('skipped', 'incomplete')}")
            continue
        err = max((x["max_abs_vs_fp32"] for x in v.values() if "us" in x),
                  default=float("nan"))
        forced = " ".join(f"{k[1:]}:{x['us']:.0f}" for k, x in v.items()
                          if k[0] == "s" and "us" in x)
        print(f"{r['shape']:<27}" + "".join(f"{cell(v.get(k, {})):>14}" for k in
                                            ("old", "new", "pack", "pack1")) +
              f"  {err:.0e}  {forced}")


if __name__ == "__main__":
    raise SystemExit(main())
