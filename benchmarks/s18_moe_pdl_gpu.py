"""The decode MoE layer chained (issue 24's MoE T = 1 and Qwen3-30B-A3B B = 1 targets): routing,
the align-free gate-up and the slot down as programmatic dependent launches (pdl.CHAIN
"moe_routing" / "moe_direct") vs plain launches:

    PYTHONPATH=$PWD python benchmarks/s18_moe_pdl_gpu.py $OUT [budget_s, default 150]

The layer of tskernels.bench.cases.moe (router logits -> routing -> fused experts, Qwen3-30B-A3B
shape, bf16), T = 1 / 2 / 4 / 8. Each variant is first checked bit-equal to the plain launches
(eager, and a replayed CUDA graph with NaN-poisoned outputs); timing: one CUDA graph of back-to-
back layers cycling through 4 input sets with their own 1.2 GB weight copies, median µs.
JSON: $OUT/s18_moe_pdl.json; a table last. (The run in benchmarks/RESULTS.md, at fe9a380, also
timed the slot down asking L2 for its first 2 / 4 weight tiles before its wait: slower, removed.)
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
T0 = time.time()
MOE = frozenset({"moe_routing", "moe_direct"})
VARIANTS = {"plain": False, "chain": True}


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def use(name):
    from tskernels.ops.shared import pdl
    pdl.CHAIN = frozenset(pdl.NAMES) if VARIANTS[name] else frozenset(pdl.NAMES) - MOE


def replay_equal(fn, d, want, times: int = 3) -> None:
    """fn(d) captured in a CUDA graph (after a warm call on a side stream) gives `want` on every
    replay into its NaN-poisoned output (shared with benchmarks/s21_moe_direct_tiles_gpu.py)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(d)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = fn(d)
    for _ in range(times):
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, want), "graph replay differs"


def run_variant(res: dict, key: str, fn, sets: list, check) -> None:
    """res["checks"][key] = check() (its "ok ..." line; raising records the failure instead),
    then res["us"][key]: two medians of fn over sets in graph replay; one line printed."""
    from tskernels.bench import core
    try:
        res["checks"][key] = check()
        res["us"][key] = [round(statistics.median(core.time_fn(
            fn, sets, "cuda", iters=200, graph=True)), 2) for _ in range(2)]
    except Exception as e:  # noqa: BLE001
        res["checks"][key] = f"FAILED {type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc()
    print(f"{key}: {res['checks'][key]} {res['us'].get(key)}", flush=True)


def finish(out: Path, name: str, res: dict, width: int = 24) -> int:
    """Write res as $OUT/name, then the table of its "us" medians."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(res, indent=2))
    print(f"\ncopy {res['copy_TBps']} TB/s; MoE layer us (two medians)")
    for key, us in res["us"].items():
        print(f"{key:<{width}} {us}")
    return 0


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
    import tskernels
    from tskernels.bench import core
    from tskernels.bench.cases import moe as mcases
    res = {"command": "python benchmarks/s18_moe_pdl_gpu.py $OUT " + str(int(budget)),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(), "checks": {}, "us": {}}
    res["copy_TBps"] = round(core.copy_bandwidth("cuda") / 1e3, 3)
    g = torch.Generator(device="cuda").manual_seed(5)
    with tskernels.use_backend("moe.topk_softmax=triton,moe.fused_experts=triton"):
        for t in (1, 2, 4, 8):
            if left(budget) < 25:
                break
            sets = [mcases._make({"T": t, **mcases.QWEN3}, "cuda", g) for _ in range(4)]
            use("plain")
            want = mcases._ours(sets[0]).clone()
            for name in VARIANTS:
                key = f"T={t} {name}"
                if left(budget) < 15:
                    break
                use(name)

                def check():
                    got = mcases._ours(sets[0])
                    assert torch.equal(got, want), f"eager differs {(got - want).abs().max()}"
                    replay_equal(mcases._ours, sets[0], want)
                    return "ok"
                run_variant(res, key, mcases._ours, sets, check)
            use("plain")
            del sets
            torch.cuda.empty_cache()
    return finish(out, "s18_moe_pdl.json", res)


if __name__ == "__main__":
    sys.exit(main())
