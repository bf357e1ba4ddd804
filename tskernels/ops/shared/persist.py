"""Persistent-grid pieces for any backend (a backend may not import another backend's): how
many programs of a compiled kernel fit resident on one SM, and a CTA barrier the software
pipeliner does not treat as one.

(tskernels/ops/gemm/triton_gemv.py takes `resident_programs` and `cta_sync` from here; its
`_resident` / `_num_sms` keep their own caches and the interpreter's SM count of 4.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def resident_programs(kern, device: torch.device, warps: int) -> int:
    """Programs of a compiled kernel that fit on one SM at once: registers (allocated per warp
    in 256s), threads, 32 blocks, shared memory."""
    kern._init_handles()
    props = torch.cuda.get_device_properties(device)
    per_warp = -(-kern.n_regs * 32 // 256) * 256
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    n = min(regs // max(1, per_warp * warps),
            props.max_threads_per_multi_processor // 32 // warps, 32)
    smem = kern.metadata.shared
    if smem:
        n = min(n, getattr(props, "shared_memory_per_multiprocessor", 228 << 10) // smem)
    return max(1, n)


@triton.jit
def cta_sync(v):
    """bar.sync 0 (every thread of the CTA reaches it; memory before it is ordered before
    what follows in the CTA), returning v so the barrier stays in program order. Unlike
    tl.debug_barrier() inside a loop, it does not stop Triton's software pipeliner from
    pipelining that loop. NVIDIA only (inline PTX; the interpreter: use tl.debug_barrier)."""
    return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [v],
                                     dtype=tl.int32, is_pure=False, pack=1)
