"""Session 24 lab: decode GEMVs without split-K (issue 24's gemv target, >= 3.6 TB/s on the
Llama-3-8B projections, and the B = 1 step).

    python benchmarks/s24_gemv_gpu.py OUT_DIR [SECONDS [few]]

For each Llama-3-8B projection at M = 1 (and M = 16 for the tensor-core form), side by side in
one process: the shipped split-K streaming kernel (PDL + L2 prefetch), cuBLAS (torch.mm), the
CUDA-core rows kernel (triton_gemv._rows_kernel: BN whole rows per program, no split) over a
sweep of BN / BK / warps / prefetch, and the tensor-core kernel with narrow tiles and no split
(SWEEP = True, call 1; call 2 ran the short list below, and also timed M = 16 with a no-split
rule and fp8 M = 1 with a rows form folding the block scales into x: both dropped, the code
removed; s24_gemv_call2.json).
Every variant is first compared with the float32 product (NaN-poisoned outputs), then timed by
CUDA-graph replay of back-to-back calls over weight copies rotated past 200 MB (medians).
Writes OUT_DIR/s24_gemv.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from tskernels.bench import core
from tskernels.ops.gemm import triton_gemv as tg

ROTATE_BYTES = 200 << 20
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
ROWS = [dict(BN=bn, BK=bk, num_warps=w) for bn in (2, 4, 8) for bk in (512, 1024, 2048)
        for w in (4, 8) if bn * bk <= 4096 * w // 4 * 2]
# call 2: the call-1 leaders only, each also with one / two prefetched tiles
ROWS_SHORT = [dict(BN=4, BK=2048, num_warps=4), dict(BN=2, BK=1024, num_warps=4),
              dict(BN=8, BK=1024, num_warps=8)]

TC = [dict(BN=bn, BK=bk, num_stages=s, num_warps=4) for bn in (16, 32) for bk in (128, 256)
      for s in (4, 6)]


def _sets(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(0)
    count = max(2, -(-ROTATE_BYTES // (n * k * 2)) + 1)
    out = []
    for _ in range(count):
        out.append(dict(a=torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16),
                        b=(torch.randn(n, k, generator=gen, device="cuda") / 64).to(
                            torch.bfloat16),
                        o=torch.empty(m, n, dtype=torch.bfloat16, device="cuda")))
    return out


def _time(fn, sets, iters=300):
    return round(statistics.median(core.time_fn(fn, sets, "cuda", iters=iters, graph=True)), 2)


def _check(fn, d) -> float:
    d["o"].fill_(float("nan"))
    fn(d)
    torch.cuda.synchronize()
    ref = d["a"].float() @ d["b"].float().t()
    err = ((d["o"].float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"rel error {err}")
    return err


# "few" (third argument): M = 1 / 2 / 4, the rows kernel at 2-4 rows over these configs (needs
# the tree of commit e07478f, where _rows_kernel takes 2-4 rows and triton_gemv.ROWS_FEW exists;
# measured slower than the split kernel and removed again: s24_gemv_few.json)
FEW = [dict(BN=bn, BK=bk, num_warps=4) for bn in (2, 4) for bk in (256, 512, 1024)] + \
    [dict(BN=4, BK=1024, num_warps=8), dict(BN=8, BK=512, num_warps=8)]
SWEEP = False  # True: call 1's full sweep (rows and narrow tensor-core tiles)


def _old(fn):
    """fn with the session-23 launches: the split kernel at every M <= 16."""
    def run(d):
        keep = tg.ROWS_M1, getattr(tg, "ROWS_FEW", None)
        tg.ROWS_M1 = None
        if keep[1] is not None:
            tg.ROWS_FEW = {}
        try:
            return fn(d)
        finally:
            tg.ROWS_M1 = keep[0]
            if keep[1] is not None:
                tg.ROWS_FEW = keep[1]
    return run


def rows(cfg):
    return lambda d: tg.rows_mm(d["a"], d["b"], d["o"], config=cfg)


def tc_nosplit(cfg, pdl=True):
    def run(d):
        x, w, out = d["a"], d["b"], d["o"]
        m, k = x.shape
        n = w.shape[0]
        tg._stream_kernel[(triton.cdiv(n, cfg["BN"]), 1)](
            w, x, out, out, out, out, out, out, m, n, k, w.stride(0), x.stride(0),
            out.stride(0), out.stride(0), 0, 0, k, BN=cfg["BN"], BK=cfg["BK"], MP=tg.mpad(m),
            BLOCK=128, SPLIT=False, FP8=False, HAS_RES=False, EVEN_K=k % cfg["BK"] == 0,
            PDL=pdl, num_stages=cfg["num_stages"], num_warps=cfg["num_warps"],
            **({"launch_pdl": True} if pdl else {}))
    return run


def main() -> None:
    out_dir = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 240
    t0 = time.time()
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    res = {"command": "python " + " ".join(sys.argv), "copy_roofline_GBps": round(roof, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    few = len(sys.argv) > 3 and sys.argv[3] == "few"
    for m in ((1, 2, 4) if few else (1, 16)):
        for n, k in SHAPES:
            if time.time() - t0 > budget:
                print("budget spent", flush=True)
                break
            sets = _sets(m, n, k)
            wb = n * k * 2
            variants = {"shipped": lambda d: tg.stream_mm(d["a"], d["b"], d["o"]),
                        "old": _old(lambda d: tg.stream_mm(d["a"], d["b"], d["o"])),
                        "cublas": lambda d: torch.mm(d["a"], d["b"].t(), out=d["o"])}
            if m in (2, 4):  # M = 2-4: the rows kernel's per-row accumulators
                for c in FEW:
                    variants[f"rows_{c['BN']}x{c['BK']}w{c['num_warps']}"] = rows(c)
            if m == 1 and not few:
                for c in (ROWS if SWEEP else ROWS_SHORT):
                    variants[f"rows_{c['BN']}x{c['BK']}w{c['num_warps']}"] = rows(c)
                    if not SWEEP:
                        for p in (1, 2):
                            variants[f"rows_{c['BN']}x{c['BK']}w{c['num_warps']}p{p}"] = \
                                rows(dict(c, PREFETCH=p))
            for c in (TC if SWEEP else []):
                variants[f"tc_{c['BN']}x{c['BK']}s{c['num_stages']}"] = tc_nosplit(c)
            row = {"M": m, "N": n, "K": k, "weight_MB": round(wb / 1e6, 1),
                   "floor_us": round(wb / roof / 1e3, 2), "us": {}, "err": {}, "failed": {}}
            for name, fn in variants.items():
                try:
                    row["err"][name] = _check(fn, sets[0])
                    row["us"][name] = _time(fn, sets)
                except Exception as e:  # noqa: BLE001 - a config that cannot build is a row
                    row["failed"][name] = f"{type(e).__name__}: {str(e)[:200]}"
            # the best rows config again with L2 prefetch before the PDL wait
            if m == 1 and SWEEP:
                best = min((v for v in row["us"] if v.startswith("rows_")),
                           key=row["us"].get)
                c = next(c for c in ROWS
                         if f"rows_{c['BN']}x{c['BK']}w{c['num_warps']}" == best)
                for p in (1, 2):
                    name = f"{best}p{p}"
                    fn = rows(dict(c, PREFETCH=p))
                    row["err"][name] = _check(fn, sets[0])
                    row["us"][name] = _time(fn, sets)
            row["TBps"] = {v: round(wb / t / 1e6, 3) for v, t in row["us"].items()}
            res["rows"].append(row)
            top = sorted(row["us"].items(), key=lambda kv: kv[1])[:4]
            print(f"M={m:<2} {n:>5}x{k:<5} floor {row['floor_us']:6.2f} shipped "
                  f"{row['us'].get('shipped')} cublas {row['us'].get('cublas')} | best "
                  + ", ".join(f"{a} {b}" for a, b in top) + f" | failed {len(row['failed'])}",
                  flush=True)
            del sets
            torch.cuda.empty_cache()
    (out_dir / ("s24_gemv_few.json" if few else "s24_gemv.json")).write_text(json.dumps(res, indent=1))
    print("\nM  shape        floor  old / shipped / cublas  best (TB/s)")
    for r in res["rows"]:
        best = min(r["us"], key=r["us"].get)
        u = r["us"]
        print(f"{r['M']:<2} {r['N']:>5}x{r['K']:<5} {r['floor_us']:6.2f} {u.get('old', u.get('split'))}"
              f" / {u.get('shipped')} / {u.get('cublas')}  {best} {u[best]} ({r['TBps'][best]})")


if __name__ == "__main__":
    main()
