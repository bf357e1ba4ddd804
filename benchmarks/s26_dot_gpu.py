"""Session 26 lab: the persistent tensor-core decode GEMM (triton_gemv._dot_persist_kernel via
dot_persist_mm) at a few rows, against what ships (the split kernel `stream_mm`: one weight tile
per program, split-K with atomics) and cuBLAS, for issue 24's decode targets:
  - 16-bit gemv at M = 16 (>= 3.6 TB/s on the Llama-3-8B projections; qkv 2.79 / o 2.88 TB/s in
    session 25), and M = 4 / 8 (the B = 4-8 decode steps), Qwen3-30B-A3B qkv / o;
  - block-fp8 at M = 1 / 16 / 64 on the DeepSeek-V3 shapes (>= 3.3 TB/s of fp8 weight bytes;
    1.45-3.6 TB/s in session 17).

    python benchmarks/s26_dot_gpu.py OUT_DIR BUDGET_S [16bit|fp8|both]

Every variant is first compared with the float32 product on a NaN-poisoned output (a variant
that fails is reported, not timed); timing: tskernels.bench.core.time_fn with graph=True
(back-to-back calls in one CUDA graph over input sets rotated past 200 MB), medians; the copy
roofline measured in the same run. Writes OUT_DIR/s26_dot.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tskernels.bench import core
from tskernels.bench.cases import gemm as cases
from tskernels.ops.gemm import triton_gemv as tg
from tskernels_ref import gemm as ref

ROTATE_BYTES = 200 << 20
SHAPES16 = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (5120, 2048),
            (2048, 4096)]
SHAPES8 = [(7168, 2048), (2112, 7168), (24576, 1536), (7168, 16384)]
CONFIGS16 = [dict(BN=bn, BK=bk, num_stages=s, num_warps=4, **({"PER_SM": r} if r else {}))
             for bn, bk, s in ((64, 128, 4), (64, 128, 6), (64, 256, 4), (128, 128, 4))
             for r in (None, 1, 2)]
CONFIGS8 = [dict(BN=bn, BK=128, num_stages=s, num_warps=4, **({"PER_SM": r} if r else {}))
            for bn, s in ((64, 4), (64, 6), (128, 4), (32, 6))
            for r in (None, 1, 2)]


def _name(c):
    return f"dot_{c['BN']}x{c['BK']}s{c['num_stages']}r{c.get('PER_SM', 'res')}"


def _sets16(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(0)
    count = max(2, -(-ROTATE_BYTES // (n * k * 2)) + 1)
    return [dict(a=torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16),
                 b=(torch.randn(n, k, generator=gen, device="cuda") / 64).to(torch.bfloat16),
                 o=torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
            for _ in range(count)]


def _sets8(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(0)
    count = max(2, -(-ROTATE_BYTES // (n * k)) + 1)
    sets = [cases._fp8_make({"M": m, "N": n, "K": k}, "cuda", gen) for _ in range(count)]
    for d in sets:
        d["o"] = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    return sets


def _check(fn, d, fp8) -> float:
    d["o"].fill_(float("nan"))
    fn(d)
    torch.cuda.synchronize()
    if fp8:
        want = ref.fp8_block_mm(d["a"], d["sa"], d["b"], d["sb"], out_dtype=torch.float32)
    else:
        want = d["a"].float() @ d["b"].float().t()
    got = d["o"].float()
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    return err if torch.isfinite(got).all() else float("inf")


def _row(m, n, k, fp8, variants, roof):
    wb = n * k * (1 if fp8 else 2)
    sets = (_sets8 if fp8 else _sets16)(m, n, k)
    r = {"M": m, "N": n, "K": k, "fp8": fp8, "weight_MB": round(wb / 1e6, 1),
         "floor_us": round(wb / roof / 1e3, 2), "err": {}, "us": {}}
    for name, fn in variants.items():
        try:
            if name != "cublas":
                e = r["err"][name] = round(_check(fn, sets[0], fp8), 6)
                if not e < 2e-2:
                    print(f"  {name}: error {e} -- not timed", flush=True)
                    continue
            r["us"][name] = round(statistics.median(
                core.time_fn(fn, sets, "cuda", iters=300, graph=True)), 2)
        except Exception as ex:  # noqa: BLE001 - recorded, the others go on
            r["err"][name] = f"{type(ex).__name__}: {str(ex)[:200]}"
    r["TBps"] = {v: round(wb / t / 1e6, 3) for v, t in r["us"].items()}
    del sets
    torch.cuda.empty_cache()
    u = r["us"]
    top = sorted(u.items(), key=lambda kv: kv[1])[:4]
    print(f"{'fp8' if fp8 else 'b16'} M={m:<2} {n:>5}x{k:<5} floor {r['floor_us']:6.2f} shipped "
          f"{u.get('shipped')} cublas {u.get('cublas')} | " +
          ", ".join(f"{a} {b}" for a, b in top), flush=True)
    return r


def main() -> int:
    out, budget = Path(sys.argv[1]), float(sys.argv[2])
    which = sys.argv[3] if len(sys.argv) > 3 else "both"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    res = {"command": "python " + " ".join(sys.argv), "copy_roofline_GBps": round(roof, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "device": torch.cuda.get_device_name(), "rows": []}
    keep = (tg.DOT_16BIT, tg.DOT_FP8)
    tg.DOT_16BIT = tg.DOT_FP8 = None  # "shipped" = the split kernel
    work = []
    if which in ("16bit", "both"):
        work += [(16, n, k, False) for n, k in SHAPES16]
    if which in ("fp8", "both"):
        work += [(m, n, k, True) for m in (1, 16, 64) for n, k in SHAPES8]
    if which in ("16bit", "both"):
        work += [(4, n, k, False) for n, k in SHAPES16]
    for m, n, k, fp8 in work:
        if time.time() - t0 > budget:
            print("budget spent", flush=True)
            break
        if fp8:
            vs = {"shipped": lambda d: tg.stream_mm(d["a"], d["b"], d["o"], x_scale=d["sa"],
                                                   w_scale=d["sb"])}
            if m > 1:
                vs["cublas"] = cases.scaled_mm_blockwise
            for c in CONFIGS8:
                vs[_name(c)] = (lambda c: lambda d: tg.dot_persist_mm(
                    d["a"], d["b"], d["o"], x_scale=d["sa"], w_scale=d["sb"], config=c))(c)
        else:
            vs = {"shipped": lambda d: tg.stream_mm(d["a"], d["b"], d["o"]),
                  "cublas": lambda d: torch.mm(d["a"], d["b"].t(), out=d["o"])}
            for c in CONFIGS16:
                vs[_name(c)] = (lambda c: lambda d: tg.dot_persist_mm(
                    d["a"], d["b"], d["o"], config=c))(c)
        res["rows"].append(_row(m, n, k, fp8, vs, roof))
        (out / "s26_dot.json").write_text(json.dumps(res, indent=1))
    tg.DOT_16BIT, tg.DOT_FP8 = keep
    print("\nkind M  shape        floor  shipped (TB/s) / cublas / best dot (TB/s)")
    for r in res["rows"]:
        u, t = r["us"], r["TBps"]
        bd = min((v for v in u if v.startswith("dot")), key=u.get, default=None)
        print(f"{'fp8' if r['fp8'] else 'b16'} {r['M']:<2} {r['N']:>5}x{r['K']:<5} "
              f"{r['floor_us']:6.2f} {u.get('shipped')} ({t.get('shipped')}) / "
              f"{u.get('cublas')} / {bd} {u.get(bd)} ({t.get(bd)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
