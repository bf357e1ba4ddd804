"""Lab script (session 23): the prefill MoE layer (Qwen3-30B-A3B shape, T = 8192) of whatever
tskernels is first on PYTHONPATH, graph-replay wall time of the layer and of fused_experts with
explicit tiles, plus the tiles the plain call launches and a checksum of its output. Run once
per tree, alternately (benchmarks/s23_moe_ab_gpu.sh).

    python benchmarks/s23_moe_ab.py LABEL [T ...]
"""
import json
import sys

import torch

import tskernels
from tskernels.bench.cases import moe as cases
from tskernels.ops.moe import triton_experts as te

BACKEND = "moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton"


def wall(fn, sets, calls=4, reps=10):
    for s in sets:
        fn(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(sets[i % len(sets)])
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(ts)[len(ts) // 2]


def main():
    label = sys.argv[1]
    res = {"label": label, "rows": []}
    for t in [int(x) for x in sys.argv[2:]] or [8192]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        sets = [cases._make({"T": t, **cases.QWEN3}, "cuda", gen) for _ in range(2)]
        row = {"T": t}
        dev = sets[0]["x"].device
        try:
            from tskernels.ops.moe import _tune
            cfg, opts = _tune.launch(t, 2048, 768, 128, 8, False, dev)
            row["launch"] = [str(cfg), str(opts)]
        except ImportError:
            row["launch"] = [str(te.tiles_for(t, False)), "(no _tune)"]
        tiles = te.tiles_for(t, False)
        with tskernels.use_backend(BACKEND):
            out = cases._ours(sets[0])
            row["checksum"] = float(out.double().abs().sum())
            row["layer_us"] = wall(cases._ours, sets)
            row["layer_us_again"] = wall(cases._ours, sets)

            def explicit(d):
                w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
                return te.experts(d["x"], d["w13"], d["w2"], w, ids, tiles=tiles)
            row["explicit_tiles_us"] = wall(explicit, sets)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
