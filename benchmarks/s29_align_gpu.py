"""Session 29 lab (issue 24's MoE T = 8192 target): moe.align_by_expert's offsets pass split
over E_P / 8 programs (one per 8 experts' columns, totals by atomics in the count pass) against
the one-program pass it replaced (the previous tree's module, copied by the caller to
benchmarks/_s29_align_old.py), Qwen3-30B-A3B routing (E = 128, top-8), block 64 and 128.

    python benchmarks/s29_align_gpu.py OUT_DIR

Both forms' outputs are compared exactly on every problem first; CUDA-graph replay of 20 calls,
medians, two alternated rounds. Writes OUT_DIR/s29_align.json; prints a table last.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _s29_align_old as old  # noqa: E402

from tskernels.bench.core import time_fn  # noqa: E402
from tskernels.ops.moe import triton_align as new  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    res = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (1024, 2048, 8192, 32768):
        for block in (64, 128):
            sets = [{"ids": torch.topk(torch.rand(t, 128, device="cuda", generator=gen), 8,
                                       dim=1).indices.to(torch.int32)} for _ in range(4)]
            for d in sets:
                a, b = old.align(d["ids"], 128, block), new.align(d["ids"], 128, block)
                for x, y in zip(a, b):
                    n = int(a[2].item()) if x is a[0] else x.numel()
                    assert torch.equal(x[:n], y[:n]), (t, block)
            row = {"T": t, "block": block}
            for rnd in (1, 2):
                for name, mod in (("old", old), ("new", new)):
                    us = time_fn(lambda d, m=mod: m.align(d["ids"], 128, block), sets, "cuda",
                                 iters=20, graph=True)
                    row[f"{name}_us_{rnd}"] = round(statistics.median(us), 2)
            res["rows"].append(row)
            print(row, flush=True)
            (out / "s29_align.json").write_text(json.dumps(res, indent=1))
    print("\nT      block  one-program offsets (us)   E_P / 8 programs (us)")
    for r in res["rows"]:
        print(f"{r['T']:<6} {r['block']:<6} {r['old_us_1']:8.2f} {r['old_us_2']:8.2f}   "
              f"{r['new_us_1']:8.2f} {r['new_us_2']:8.2f}")


if __name__ == "__main__":
    main()
