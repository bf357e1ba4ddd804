"""Lab script (issue 23, session 22): which q / k L2 norm form of the GDN prefill is closer to
exact arithmetic. The "launch" norm (default) rounds the normalised q / k to bf16 before the
products, as FLA 0.6.0 does; the opt-in "fused" norm keeps the raw bf16 keys and scales by
fp32 rsqrt norms inside the kernels. Against each other they differ by 4.2e-3 rel rms at bf16
(session 22, call 2), against FLA the launch form by 1.25e-3; this measures each against the
float64 chunked reference (tskernels_ref.gdn, float64 inputs made from the same bf16 ones) on
the bench's Qwen3-Next data (16 key / 32 value heads, dims 128): o and final-state rel rms /
rel max per variant, FLA too when its wheels are in .whl.

    python benchmarks/s22_gdn_norm_accuracy_gpu.py $OUT     # -> $OUT/s22_gdn_norm_accuracy.json

Session 23 ran it again (the session-22 files were not kept) with the plain call's _launch_rule
form and both state_bv values.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SHAPES = [{"T": 4096, "N": 1}, {"T": 8192, "N": 4}]
# (session 23: the plain call picks norm / state_bv by _launch_rule; the explicit forms beside it)
VARIANTS = {"default": {},
            "launch, state_bv 32": {"norm": "launch", "state_bv": 32},
            "fused norm, state_bv 32": {"norm": "fused", "state_bv": 32},
            "launch, state_bv 64": {"norm": "launch", "state_bv": 64},
            "fused norm, state_bv 64": {"norm": "fused", "state_bv": 64},
            "launch, no overlap": {"norm": "launch", "state_bv": 32, "overlap": False}}


def _rel(a, b) -> dict:
    a, b = a.double(), b.double()
    return {"rel_rms": (a - b).norm().item() / max(b.norm().item(), 1e-30),
            "rel_max": (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SHAPES if dev == "cuda" else [{"T": 256, "N": 2}]
    import tskernels
    import tskernels_ref.gdn as ref
    from tskernels.bench.cases import gdn as cases
    spec = next(k for k in tskernels.kernels("gdn", "chunk_prefill") if k.backend == "triton")
    fla = None
    if dev == "cuda":
        import s15_gdn_gpu
        if s15_gdn_gpu._install_fla() is None and cases._fla() is not None:
            fla = cases._fla_prefill
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": dev,
           "rows": []}
    for shape in shapes:
        gen = torch.Generator(device=dev).manual_seed(0)
        d = cases._make_prefill(shape, dev, gen)
        if dev == "cpu":  # (the interpreter tier: bf16 is not modelled there)
            d = {k: (v.half() if v.dtype == torch.bfloat16 else v) for k, v in d.items()}
        want_o, want_s = ref.chunk_prefill(d["q"].double(), d["k"].double(), d["v"].double(),
                                           d["g"].double(), d["beta"].double(),
                                           cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True)
        row = {"shape": shape}
        for name, tun in VARIANTS.items():
            o, s = spec.fn(d["q"], d["k"], d["v"], d["g"], d["beta"], cu_seqlens=d["cu_seqlens"],
                           use_qk_l2norm=True, tuning=tun)
            row[name] = {"o": _rel(o, want_o), "state": _rel(s, want_s)}
        if fla is not None:
            o, s = fla(d)
            row["FLA 0.6.0"] = {"o": _rel(o[0], want_o), "state": _rel(s, want_s)}
        # the bf16 rounding of the exact output alone, for scale
        row["exact o rounded to the dtype"] = {"o": _rel(want_o.to(d["q"].dtype), want_o)}
        res["rows"].append(row)
        for k, v in row.items():
            if k != "shape":
                print(f"T={shape['T']},N={shape['N']:<3} {k:<30} "
                      + "  ".join(f"{t} rms {x['rel_rms']:.2e} max {x['rel_max']:.2e}"
                                  for t, x in v.items()), flush=True)
    (out / "s22_gdn_norm_accuracy.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
