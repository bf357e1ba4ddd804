"""Session 25 lab: the M = 1 gemv's fixed cost (issue 24's gemv target: >= 3.6 TB/s; the o
projection 4096 x 4096 read 3.36-3.44 TB/s with the shipped rows kernel).

    python benchmarks/s25_gemv_gpu.py OUT_DIR [SECONDS]

The shipped rows kernel (triton_gemv._rows_kernel: BN whole rows per program, one BK tile in
flight per program, a grid of N / BN programs in ~2 waves on the o projection) against the
persistent form (triton_gemv._rows_persist_kernel through rows_mm with PERSIST: as many
programs as fit resident, each walking its row blocks with the next tile's load issued before
the current tile's FMAs, the first tile loaded before the PDL wait) over BN / BK / warps, and
cuBLAS (torch.mm). Call 1 of session 25 timed a first version of the persistent kernel defined
in this script with R programs per SM (R = 2-8, not the resident count), and a pure-read
kernel (plain launches, no PDL) that read slower than the gemv itself (so no floor; both
removed, s25_gemv_call1.json).
Every variant is first compared with the float32 product (NaN-poisoned outputs), then timed
by CUDA-graph replay of back-to-back calls over weight copies rotated past 200 MB (medians).
Writes OUT_DIR/s25_gemv.json; prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

from s24_gemv_gpu import _check, _sets, _time  # same inputs, check and timing as session 24

from tskernels.bench import core
from tskernels.ops.gemm import triton_gemv as tg
# Llama-3-8B o / qkv / gate-up / down, Qwen3-30B-A3B qkv / o / router, the two lm_heads
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336),
          (5120, 2048), (2048, 4096), (128, 2048), (151936, 2048), (128256, 4096)]


def persist(cfg):
    return lambda d: tg.rows_mm(d["a"], d["b"], d["o"], config=dict(cfg, PERSIST=True))


def resident(cfg, d) -> int:
    n, k = d["b"].shape
    bk = min(cfg["BK"], max(64, triton.next_power_of_2(k)))
    meta = dict(KT=triton.cdiv(k, bk), BN=cfg["BN"], BK=bk, HAS_RES=False, EVEN_K=k % bk == 0,
                PDL=True, num_warps=cfg["num_warps"], num_stages=1)
    return tg._resident(tg._rows_persist_kernel, d["b"].device,
                        (d["b"], d["a"], d["o"], d["o"], n, k, k, triton.cdiv(n, cfg["BN"])),
                        (), meta, None)


# call 2 showed the resident count is not the best program count (4 x 2048, 4 warps: 4
# resident per SM, 512 programs, slower than call 1's 342); call 3 swept PER_SM over six
# tile shapes (4 x 2048, 4 warps led); call 4 (S25_SET=small) the smaller weights with more
# shapes, to set the rule
CONFIGS = [dict(BN=bn, BK=bk, num_warps=w, PER_SM=r)
           for bn, bk, w in ((4, 2048, 4), (4, 1024, 4), (2, 2048, 4), (2, 2048, 8),
                             (8, 1024, 8), (8, 1024, 4))
           for r in (2, 3, 4, 5, 6)]
SMALL_CONFIGS = [dict(BN=bn, BK=bk, num_warps=w, PER_SM=r)
                 for bn, bk, w in ((4, 2048, 4), (2, 2048, 8), (2, 4096, 4), (4, 4096, 8))
                 for r in (2, 3, 4, 5, 6)]
SMALL_SHAPES = [(4096, 4096), (6144, 4096), (5120, 2048), (2048, 4096), (128, 2048),
                (1024, 4096), (3072, 3072), (8192, 2048), (4096, 8192), (12288, 4096),
                (2048, 7168)]
if os.environ.get("S25_SET") == "small":
    CONFIGS, SHAPES = SMALL_CONFIGS, SMALL_SHAPES


def main() -> None:
    out_dir = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 240
    t0 = time.time()
    roof = core.copy_bandwidth("cuda")
    print(f"copy roofline {roof / 1e3:.2f} TB/s", flush=True)
    res = {"command": "python " + " ".join(sys.argv), "copy_roofline_GBps": round(roof, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    for n, k in SHAPES:
        if time.time() - t0 > budget:
            print("budget spent", flush=True)
            break
        sets = _sets(1, n, k)
        wb = n * k * 2
        variants = {"shipped": lambda d: tg.stream_mm(d["a"], d["b"], d["o"]),
                    "cublas": lambda d: torch.mm(d["a"], d["b"].t(), out=d["o"])}
        for c in CONFIGS:
            variants[f"persist_{c['BN']}x{c['BK']}w{c['num_warps']}r{c['PER_SM']}"] = persist(c)
        row = {"M": 1, "N": n, "K": k, "weight_MB": round(wb / 1e6, 1),
               "floor_us": round(wb / roof / 1e3, 2), "us": {}, "err": {}, "failed": {}}
        for name, fn in variants.items():
            try:
                row["err"][name] = _check(fn, sets[0])
                row["us"][name] = _time(fn, sets)
            except Exception as e:  # noqa: BLE001 - a config that cannot build is a row
                row["failed"][name] = f"{type(e).__name__}: {str(e)[:300]}"
        row["resident"] = {f"{c['BN']}x{c['BK']}w{c['num_warps']}": resident(c, sets[0])
                           for c in CONFIGS if c["PER_SM"] == 2}
        row["TBps"] = {v: round(wb / t / 1e6, 3) for v, t in row["us"].items()}
        res["rows"].append(row)
        top = sorted(row["us"].items(), key=lambda kv: kv[1])[:5]
        print(f"{n:>5}x{k:<5} floor {row['floor_us']:6.2f} shipped {row['us'].get('shipped')} "
              f"cublas {row['us'].get('cublas')} | best " + ", ".join(f"{a} {b}" for a, b in top)
              + f" | failed {row['failed']}", flush=True)
        del sets
        torch.cuda.empty_cache()
    (out_dir / "s25_gemv.json").write_text(json.dumps(res, indent=1))
    print("\nshape        floor  shipped / cublas / best persist (TB/s)")
    for r in res["rows"]:
        u = r["us"]
        bp = min((v for v in u if v.startswith("persist")), key=u.get, default=None)
        print(f"{r['N']:>5}x{r['K']:<5} {r['floor_us']:6.2f} {u.get('shipped')} "
              f"({r['TBps'].get('shipped')}) / {u.get('cublas')} / {bp} {u.get(bp)} "
              f"({r['TBps'].get(bp)})")


if __name__ == "__main__":
    main()
