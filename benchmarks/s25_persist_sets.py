"""From s25_gemv.json (benchmarks/s25_gemv_gpu.py), the serve_ab.py switch sets that put the
persistent rows gemv in a decode step (session 25 lab; printed as one AB_SETS string):
  all:   ROWS_M1 = the persistent config with the least geometric-mean time over the shapes
  table: ROWS_SHAPE_CONFIGS = each shape's fastest persistent config where it beats the shipped
         kernel (others keep ROWS_M1, the plain rows kernel).

    python benchmarks/s25_persist_sets.py OUT/s25_gemv.json
"""
from __future__ import annotations

import json
import math
import re
import sys


def parse(name: str) -> dict:
    bn, bk, w, r = re.fullmatch(r"persist_(\d+)x(\d+)w(\d+)r(\d+)", name).groups()
    return dict(BN=int(bn), BK=int(bk), num_warps=int(w), PERSIST=True, PER_SM=int(r))


def main() -> None:
    rows = json.load(open(sys.argv[1]))["rows"]
    names = set.intersection(*(set(v for v in r["us"] if v.startswith("persist_")) for r in rows))
    score = {v: sum(math.log(r["us"][v] / r["us"]["shipped"]) for r in rows) for v in names}
    best = min(score, key=score.get)
    table = {}
    for r in rows:
        v = min((v for v in r["us"] if v.startswith("persist_")), key=r["us"].get)
        if r["us"][v] < r["us"]["shipped"]:
            table[(r["N"], r["K"])] = parse(v)
    lit = lambda o: repr(o).replace(" ", "")  # noqa: E731
    print(f"all:--set tskernels.ops.gemm.triton_gemv.ROWS_M1={lit(parse(best))}"
          f"|table:--set tskernels.ops.gemm.triton_gemv.ROWS_SHAPE_CONFIGS={lit(table)}")


if __name__ == "__main__":
    main()
