"""Persistent-grid pieces shared by backends (a backend may not import another backend's):
how many programs of a compiled kernel fit resident on one SM, the SM count, and a CTA
barrier the software pipeliner does not treat as one.

(tskernels/ops/gemm/triton_gemv.py takes `resident_programs` and `cta_sync` from here; its
`_resident` / `_num_sms` keep their own caches and the interpreter's SM count of 4.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# the interpreter's "SM count": a few programs, so tests still walk several units each
INTERPRETER_SMS = 4

_sms: dict[torch.device, int] = {}
_resident_cache: dict[tuple, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (CPU, the interpreter: INTERPRETER_SMS)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    n = _sms.get(device)
    if n is None:
        n = _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


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


def resident(kernel, device: torch.device, args: tuple, meta: dict,
             per_sm: int | None = None) -> int:
    """Programs of `kernel` (a @triton.jit function) launched with positional `args` and
    keyword `meta` (constexprs, num_warps, num_stages; no launch options) that fit on one SM
    at once, from its compiled register and shared-memory use; per_sm caps it. Compiled once
    per (kernel, device, meta, argument dtypes). CPU (the interpreter): 1 (per_sm: up to 2)."""
    if device.type != "cuda":
        return 1 if per_sm is None else max(1, min(per_sm, 2))
    dtypes = tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
    key = (kernel, device, tuple(sorted(meta.items())), dtypes, per_sm)
    n = _resident_cache.get(key)
    if n is None:
        kern = kernel.warmup(*args, **meta, grid=(1,))
        n = resident_programs(kern, device, meta.get("num_warps", 4))
        n = max(1, n if per_sm is None else min(n, per_sm))
        _resident_cache[key] = n
    return n


def even_grid(units: int, cap: int) -> int:
    """P programs for `units` work units on at most `cap` resident programs, evened out so
    every program owns as many units (+-1): ceil(units / ceil(units / cap))."""
    units = max(1, units)
    return triton.cdiv(units, triton.cdiv(units, max(1, cap)))


@triton.jit
def cta_sync(v):
    """bar.sync 0 (every thread of the CTA reaches it; memory before it is ordered before
    what follows in the CTA), returning v so the barrier stays in program order. Unlike
    tl.debug_barrier() inside a loop, it does not stop Triton's software pipeliner from
    pipelining that loop. NVIDIA only (inline PTX; the interpreter: use tl.debug_barrier)."""
    return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [v],
                                     dtype=tl.int32, is_pure=False, pack=1)
