"""Lab script (issue 20, the B=1 ITL at 51.7k context): the paged decode attention at B = 1 over
long contexts with more KV splits than the split rule picks (it stops at ~2 programs per SM:
33 splits for 8 KV heads on 132 SMs). CUDA-graph replay, input sets rotated past L2, medians;
TB/s of the K/V bytes read; every split count's output against fp32 SDPA.

    python benchmarks/s15_decode_splits.py $OUT            # JSON: $OUT/s15_decode_splits.json
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from attention_gpu import _decode_runs, _decode_sets, _time  # noqa: E402


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    rows = []
    for L in (51712, 16384):
        shape = {"B": 1, "L": L, "fp8": 0}
        sets, nbytes, ref, auto = _decode_sets(shape)
        for ns in sorted({auto.num_splits, 16, 48, 64, 96, 128}):
            runs, fn = _decode_runs(sets, 0, ns, lambda p: None)
            try:
                us = _time(fn, runs, iters=50, graph=True)
            except Exception as e:  # a split count the merge cannot take
                rows.append(dict(L=L, splits=ns, error=f"{type(e).__name__}: {str(e)[:120]}"))
                continue
            fn(runs[0])
            torch.cuda.synchronize()
            o = runs[0]["o"].float()
            rows.append(dict(L=L, splits=ns, auto=ns == auto.num_splits, us=round(us, 2),
                             tbps=round(nbytes / us / 1e6, 3),
                             err_vs_fp32_sdpa=float((o - ref).abs().max())))
        del sets
        torch.cuda.empty_cache()
    with open(f"{out}/s15_decode_splits.json", "w") as f:
        json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       command="python benchmarks/s15_decode_splits.py $OUT", rows=rows), f,
                  indent=1)
    print(f"{'L':>6} {'splits':>6} {'us':>8} {'TB/s':>6} {'max err':>9}")
    for r in rows:
        if "us" in r:
            print(f"{r['L']:>6} {r['splits']:>6}{'*' if r['auto'] else ' '}{r['us']:>8.2f} "
                  f"{r['tbps']:>6.3f} {r['err_vs_fp32_sdpa']:>9.2e}")
        else:
            print(f"{r['L']:>6} {r['splits']:>6}  {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
