"""Lab script (session 23): RoPE q + k in one launch (rope.triton.ONE_LAUNCH, the default since
session 16's decode A/B) against one launch each, on tskernels-bench's rope shapes and more T
(Llama-3-8B heads: 32 q / 8 kv, D = 128, bf16), CUDA-graph replay, both in one process,
alternating twice. The regression sweep had T = 32768 at 215.0 us against 179.9 recorded on
2026-11-29 (one launch each).

    python benchmarks/s23_rope_ab_gpu.py OUT_DIR
"""
import json
import sys
from pathlib import Path

from tskernels.bench.core import run_bench
from tskernels.ops.rope import triton as rt

SHAPES = [{"T": t} for t in (1, 64, 256, 1024, 4096, 16384, 32768)]


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    res = {}
    for rnd in range(2):
        for flag in (True, False):
            rt.ONE_LAUNCH = flag
            r = run_bench("rope.apply_rope", SHAPES, graph=True, baselines=[])
            res.setdefault(str(flag), []).append({str(row["shape"]["T"]): row["ours"]["us"]
                                                  for row in r["rows"]})
    (out / "s23_rope_ab.json").write_text(json.dumps(res, indent=1))
    print(f"{'T':>6} {'one launch':>11} {'two':>8} {'one/two':>8}")
    for s in SHAPES:
        t = str(s["T"])
        one = min(x[t] for x in res["True"])
        two = min(x[t] for x in res["False"])
        print(f"{t:>6} {one:11.2f} {two:8.2f} {one / two:8.3f}")


if __name__ == "__main__":
    main()
