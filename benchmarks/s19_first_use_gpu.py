"""Lab script (issue 20): what a later turn's first-use builds cost on a fresh GPU machine.
Times, in one process with empty caches (TSKERNELS_CUBIN_CACHE=0, a fresh TRITON_CACHE_DIR):
the CUDA paged extend plan's construction for a later turn (its split + packed cubin: NVRTC),
the same plan again (built: in-process cache), the split-KV merge's first launch (Triton JIT)
and its second.

    python benchmarks/s19_first_use_gpu.py
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ["TSKERNELS_CUBIN_CACHE"] = "0"
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tskernels.ops.attention.cuda_extend import CudaExtendPlan  # noqa: E402


def main() -> int:
    dev = "cuda"
    page, pre, new = 64, 50800, 800
    pages = -(-(pre + new) // page)
    pt = torch.arange(pages, dtype=torch.int32, device=dev)[None]
    seq = torch.tensor([pre + new], dtype=torch.int32, device=dev)
    qo = torch.tensor([0, new], dtype=torch.int32, device=dev)
    kc = torch.randn(pages, page, 8, 128, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(new, 32, 128, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    res = {}

    def mk():
        return CudaExtendPlan(qo, pt, seq, num_q_heads=32, num_kv_heads=8, head_dim=128,
                              page_size=page, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                              scale=128 ** -0.5, paged=True, splits=None, gqa_pack=True)
    for key in ("plan_first_ms", "plan_again_ms"):
        t = time.perf_counter()
        plan = mk()
        torch.cuda.synchronize()
        res[key] = (time.perf_counter() - t) * 1e3
    res["splits"] = plan.splits
    for key in ("run_first_ms", "run_again_ms"):   # the kernel + the merge (Triton JIT once)
        t = time.perf_counter()
        plan.run(q, kc, vc)
        torch.cuda.synchronize()
        res[key] = (time.perf_counter() - t) * 1e3
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
