"""Lab script (issue 23, GDN chunked prefill speed): the run-verified "fused" WY pipeline (the
old default) vs the "wy64" variant (the chunk's K K^T, W and U as 64-row wgmma products) vs
flash-linear-attention 0.6.0's chunk_gated_delta_rule, all in one process.

Stage 1: the GPU tests of the prefill variants (tests/kernels/test_gdn.py: the wy64 tests and
the launch-variant test) under a timeout. Stage 2 (a child process under the rest of the
budget, so a hang cannot eat it): Qwen3-Next-80B-A3B's GDN shapes (16 key heads, 32 value
heads, K = V = 128, bf16, fp32 state, q/k L2 norm in the kernel) at T = 4k / 16k / 64k and
varlen 8 x 4k. Ours first (every variant, CUDA events, 3 warm-up calls, median of 12, two
input sets rotated: each set is > 50 MB, beyond L2), each new variant's o / final state
against the old default's (rel rms, rel max); a torch.profiler per-kernel device-time table at
T = 16k for old and new; then FLA: its first call autotunes several kernels (> 70 s before),
so it is warmed shape by shape in increasing size with a log line when each warm-up ends, and
skipped (ours still reported) when the budget runs out. JSON: $OUT/s15_gdn.json, rewritten
after every step; a short table last.

    python benchmarks/s15_gdn_gpu.py $OUT 230        # OUT, total seconds budget

Later sessions reuse it through the environment: GDN_OLD / GDN_NEW (JSON: the baseline tuning
and the list of variants; the profile runs the baseline and GDN_NEW's first entry), GDN_TESTS
(JSON list of [pytest -k expression, seconds]) and GDN_TAG (the JSON files' prefix instead of
"s15").
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/kernels/test_gdn.py"
# (the deterministic tests first, then the hypothesis one, each under its own limit)
TEST_K = [("launch_variants or pieces_equal_one_prefill_and or unknown_variant", 45),
          ("wy64_prefill_matches", 35)]
TEST_K = [tuple(t) for t in json.loads(os.environ["GDN_TESTS"])] if "GDN_TESTS" in os.environ \
    else TEST_K
SHAPES = [{"T": 4096, "N": 1}, {"T": 16384, "N": 1}, {"T": 65536, "N": 1}, {"T": 32768, "N": 8}]
# GDN_SHAPES (JSON list of {"T", "N"}) adds shapes after these (the profile stays at T = 16k)
SHAPES += json.loads(os.environ.get("GDN_SHAPES", "[]"))
OLD = {"variant": "fused"}
NEW = [{"variant": "wy64"},                              # 8 warps, [4,16,16] solve, 64 cols
       {"variant": "wy64", "wy_diag_x4": False},        # 128 regs: two CTAs per SM
       {"variant": "wy64", "wy_warps": 4},
       {"variant": "wy64", "wy_cols": 128},
       {"variant": "wy64", "state_stages": 4}]
OLD = json.loads(os.environ.get("GDN_OLD", "null")) or OLD
NEW = json.loads(os.environ.get("GDN_NEW", "null")) or NEW
TAG = os.environ.get("GDN_TAG", "s15")
# GDN_ROUNDS: time every variant this many times per shape, the variants in a rotated order each
# round, and report the median of the rounds (run-to-run drift then hits every variant alike).
# GDN_GRAPH=1: time CUDA-graph replays (no host launch cost in the figure; eager timing of a
# 4k prefill measured the host, FLA's most of all); a function that cannot be captured (FLA's
# varlen path converts cu_seqlens on the host) falls back to eager and says so ("mode").
ROUNDS = int(os.environ.get("GDN_ROUNDS", "1"))
GRAPH = os.environ.get("GDN_GRAPH", "0") == "1"
# GDN_FLA=0: skip the FLA baseline (its autotune takes ~2 minutes)
PROFILE_SHAPE = {"T": 16384, "N": 1}
ITERS = 12
DEV = "cuda"
FLA_WHEELS = [".whl/fla_core-0.6.0-py3-none-any.whl",
              ".whl/flash_linear_attention-0.6.0-py3-none-any.whl"]
EINOPS_WHEEL = ".whl/einops-0.8.2-py3-none-any.whl"  # FLA imports it; installed if missing
FLA_DIR = "/tmp/fla"


def _text(x) -> str:
    """A timed-out child's captured output (bytes even with text=True)."""
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _pytest(k: str, limit: float) -> dict:
    t0 = time.time()
    # parallel workers where pytest-xdist is installed: the Triton compiles dominate
    par = ["-n", "4"] if importlib.util.find_spec("xdist") else []
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfE", *par,
                            "-p", "no:cacheprovider", TESTS, "-k", k], capture_output=True,
                           text=True, timeout=limit, cwd=ROOT, env=_env())
        tail, rc = (p.stdout + p.stderr)[-3000:], p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = _text(e.stdout)[-3000:], "timeout"
    print(f"pytest -k '{k}': rc {rc} in {time.time() - t0:.0f} s\n{tail[-1200:]}", flush=True)
    return dict(k=k, rc=rc, seconds=round(time.time() - t0, 1), tail=tail)


# ---- stage 2 (child process) ------------------------------------------------------------------
def _name(tuning: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in tuning.items()) or "default"


def _rel(a, b) -> dict:
    import torch
    a, b = a.double(), b.double()
    return {"rel_rms": (a - b).norm().item() / max(b.norm().item(), 1e-30),
            "rel_max": (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)}


def _median_us(fn, sets, modes: dict | None = None, key: str = "") -> float:
    """Median µs a call; graph replay when GRAPH (falling back to eager, noted in modes)."""
    from tskernels.bench.core import time_fn
    if GRAPH and DEV == "cuda" and (modes is None or modes.get(key) != "eager"):
        import torch
        try:
            us = statistics.median(time_fn(fn, sets, DEV, iters=ITERS, warmup=3, graph=True))
            if modes is not None:
                modes[key] = "graph"
            return us
        except Exception as e:  # noqa: BLE001 - not capturable: time it eagerly
            torch.cuda.synchronize()
            if modes is not None:
                modes[key] = "eager"
                modes[key + " (graph error)"] = repr(e)[:200]
    return statistics.median(time_fn(fn, sets, DEV, iters=ITERS, warmup=3))


def _profile(fn, d) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn(d)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            fn(d)
        torch.cuda.synchronize()
    ka = p.key_averages()
    try:
        return ka.table(sort_by="device_time_total", row_limit=14)
    except Exception:  # older torch names it cuda time
        return ka.table(sort_by="cuda_time_total", row_limit=14)


def _install_fla() -> str | None:
    wheels = list(FLA_WHEELS)
    if importlib.util.find_spec("einops") is None and (ROOT / EINOPS_WHEEL).exists():
        wheels.append(EINOPS_WHEEL)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--target", FLA_DIR, *wheels], check=True, cwd=ROOT, timeout=60,
                       capture_output=True, text=True)
    except Exception as e:  # noqa: BLE001 - FLA is the baseline, not the subject
        return f"pip install of FLA failed: {e}"
    sys.path.insert(0, FLA_DIR)
    return None


def child(out: Path, deadline: float) -> int:
    import torch

    import tskernels
    from tskernels.bench.cases import gdn as cases
    spec = next(k for k in tskernels.kernels("gdn", "chunk_prefill") if k.backend == "triton")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shapes": [],
           "device": torch.cuda.get_device_name() if DEV == "cuda" else DEV, "iters": ITERS, "profile": {}}
    path = out / f"{TAG}_gdn.json"
    save = lambda: path.write_text(json.dumps(res, indent=1))  # noqa: E731

    def ours(tuning):
        return lambda d: spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"],
                                 cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True, tuning=tuning)

    data = {}
    for shape in SHAPES:
        gen = torch.Generator(device=DEV).manual_seed(0)
        sets = [cases._make_prefill(shape, DEV, gen) for _ in range(2)]
        data[_name(shape)] = sets
        row = {"shape": shape, "ours": {}, "check": {}, "mode": {}, "rounds": {}}
        want_o, want_s = ours(OLD)(sets[0])
        for _ in range(3):  # settle after allocating the sets before anything is timed
            ours(OLD)(sets[1])
        torch.cuda.synchronize()
        time.sleep(0.2)
        tunings = [OLD, *NEW]
        for tun in NEW:
            try:
                o, s = ours(tun)(sets[0])
                row["check"][_name(tun)] = {"o": _rel(o, want_o), "state": _rel(s, want_s)}
            except Exception as e:  # noqa: BLE001 - report, go on with the next variant
                row["ours"][_name(tun)] = {"error": repr(e)[:400]}
        for r in range(ROUNDS):
            for tun in tunings[r % len(tunings):] + tunings[:r % len(tunings)]:
                key = _name(tun)
                if "error" in row["ours"].get(key, {}):
                    continue
                t0 = time.time()
                try:
                    us = _median_us(ours(tun), sets, row["mode"], key)
                    row["rounds"].setdefault(key, []).append(round(us, 1))
                    us = statistics.median(row["rounds"][key])
                    row["ours"][key] = {"us": round(us, 1), "Mtok/s": round(shape["T"] / us, 3)}
                except Exception as e:  # noqa: BLE001 - report, go on with the next variant
                    row["ours"][key] = {"error": repr(e)[:400]}
                print(f"ours {_name(shape)} {key} round {r}: {row['ours'][key]} "
                      f"{row['check'].get(key, '')} ({time.time() - t0:.1f} s)", flush=True)
        res["shapes"].append(row)
        save()
    d16 = data[_name(PROFILE_SHAPE)][0]
    for tun in (OLD, NEW[0]):
        res["profile"][f"ours {_name(tun)}"] = _profile(ours(tun), d16)
        print(f"== ours {_name(tun)}, T=16384 ==\n{res['profile'][f'ours {_name(tun)}']}",
              flush=True)
    save()
    _table(res)

    if os.environ.get("GDN_FLA", "1") == "0":  # ours only (a re-check of a default)
        return 0
    err = _install_fla()
    if err or cases._fla() is None:
        res["fla_error"] = err or "fla.ops.gated_delta_rule did not import"
        print(res["fla_error"], flush=True)
        save()
        return 0
    for row in res["shapes"]:  # warm (autotune) in increasing size
        left = deadline - time.time()
        if left < 25:
            print(f"FLA: {left:.0f} s left, not warming {_name(row['shape'])}", flush=True)
            break
        t0 = time.time()
        try:
            cases._fla_prefill(data[_name(row["shape"])][0])
            if DEV == "cuda":
                torch.cuda.synchronize()
            row["fla_warm_s"] = round(time.time() - t0, 1)
            print(f"FLA autotune/warm-up done for {_name(row['shape'])} in {row['fla_warm_s']} s",
                  flush=True)
            try:
                o, s = cases._fla_prefill(data[_name(row["shape"])][0])
                want_o, want_s = ours(OLD)(data[_name(row["shape"])][0])
                row["check"]["fla_vs_old"] = {"o": _rel(o[0], want_o),
                                              "state": _rel(s, want_s)}
            except Exception as e:  # noqa: BLE001 - a layout mismatch must not lose the time
                row["check"]["fla_vs_old"] = {"error": repr(e)[:300]}
            fla_sets = data[_name(row["shape"])]
            for _ in range(3):  # settle after the autotune's allocations before timing
                cases._fla_prefill(fla_sets[0])
            torch.cuda.synchronize()
            time.sleep(0.2)
            rounds = [_median_us(cases._fla_prefill, fla_sets, row["mode"], "fla")
                      for _ in range(ROUNDS)]
            us = statistics.median(rounds)
            row["rounds"]["fla"] = [round(x, 1) for x in rounds]
            row["fla"] = {"us": round(us, 1), "Mtok/s": round(row["shape"]["T"] / us, 3)}
            for k, v in row["ours"].items():
                if "us" in v:
                    v["vs_fla"] = round(us / v["us"], 3)
        except Exception as e:  # noqa: BLE001
            row["fla"] = {"error": repr(e)[:400]}
        print(f"FLA {_name(row['shape'])}: {row.get('fla')}", flush=True)
        save()
    if deadline - time.time() > 10 and "us" in res["shapes"][1].get("fla", {}):
        res["profile"]["fla"] = _profile(cases._fla_prefill, d16)
        print(f"== fla, T=16384 ==\n{res['profile']['fla']}", flush=True)
        save()
    _table(res)
    return 0


def _table(res: dict) -> None:
    print("\nshape            variant                          us     Mtok/s  vs FLA  "
          "o rel_rms vs old")
    for row in res["shapes"]:
        fla = row.get("fla", {})
        for k, v in [*row["ours"].items(), ("FLA 0.6.0", fla)]:
            if "us" not in v:
                print(f"{_name(row['shape']):<16} {k:<30} {v.get('error', '-')[:60]}")
                continue
            chk = row["check"].get(k if k != "FLA 0.6.0" else "fla_vs_old", {}).get("o", {})
            rr = f"{chk['rel_rms']:.2e}" if chk else "-"
            print(f"{_name(row['shape']):<16} {k:<30} {v['us']:>8.1f} {v['Mtok/s']:>8.2f}  "
                  f"{v.get('vs_fla', '-')!s:>6}  {rr}")
    sys.stdout.flush()


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        return child(Path(sys.argv[2]), float(sys.argv[3]))
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out"))
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 230.0
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    tests = [_pytest(k, min(limit, budget * 0.2)) for k, limit in TEST_K]
    (out / f"{TAG}_gdn_tests.json").write_text(json.dumps(tests, indent=1))
    left = budget - (time.time() - start) - 5
    deadline = time.time() + left
    try:
        subprocess.run([sys.executable, __file__, "--child", str(out), str(deadline - 3)],
                       timeout=left, cwd=ROOT, env=_env())
    except subprocess.TimeoutExpired:
        print(f"stage 2 hit its {left:.0f} s limit (JSON holds what finished)", flush=True)
    try:
        _table(json.loads((out / f"{TAG}_gdn.json").read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"no stage 2 results: {e!r}")
    print(f"total {time.time() - start:.0f} s; tests rc {[t['rc'] for t in tests]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
