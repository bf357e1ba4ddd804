"""Programmatic dependent launch (PDL) across a decode layer's kernels (NVIDIA sm_90+).

A programmatic dependent launch lets the next kernel's programs become resident once every
program of the current kernel has executed griddepcontrol.launch_dependents (or exited); the
dependent then runs what does not depend on its predecessor and calls griddepcontrol.wait
(`gdc_wait`), which returns once the predecessor grid has completed and its memory is visible.
A kernel that triggers early therefore lets its dependents start *their* independent work
(a gemv: streaming its weights into L2) while it still runs.

The kernels named in CHAIN are launched as programmatic dependents and trigger their own
dependents at program start: RMSNorm / fused add + RMSNorm ("rmsnorm"), SiLU / GELU-mul
("act_and_mul"), RoPE ("rope"), the paged K/V store ("store_kv"), the fused q/k norm + RoPE +
K/V store of decode steps ("rope_store_kv"), the split-KV decode merge ("merge"), the MoE
routing ("moe_routing"), the one-launch add + RMSNorm + router + routing ("moe_router": it asks
L2 for its router weight rows before its wait and triggers after it, as the routing does) and the decode MoE's align-free gate-up and slot down ("moe_direct";
the routing and the gate-up wait before they trigger, so the down may read the routing's ids
before its own wait), and the six launches of the group-max sampler ("sampler": each triggers
and waits at its start). Each waits (gdc_wait) before its first load and before any store, so
correctness never depends on the launch order (the one read before a wait, the slot down's
expert id, was written by a kernel before the gate-up; every gate-up program waits before it
triggers, so that kernel had completed before the down could launch): the wait covers the
predecessor, and through the predecessor's own wait (or plain stream order) everything before
it. Reading a weight before the wait (the gemv's L2 prefetch, triton_gemv.PREFETCH_TILES) is
safe because no kernel of a step writes weights, and an L2 prefetch cannot return stale data
(L2 is where the predecessor's stores land).

CHAIN is read at every launch (so one process can time both). Every name is on by default since
the H200 A/B (benchmarks/s16_decode_gpu.py; with triton_gemv.PREFETCH_TILES = 2 and the one-launch
RoPE: dummy Llama-3-8B B=1 4.37 -> 4.17 ms/step, benchmarks/RESULTS.md "Session 16"); the MoE
names since the H200 lab run (benchmarks/s18_moe_pdl_gpu.py: the Qwen3-30B-A3B MoE layer at
T = 1 27.8 -> 26.7 us, T = 2-8 2-2.5 us faster, bit-equal) and the GPU tier of the MoE kernels
with the chain on (session 19, benchmarks/results/h200/s19_gpu_tier.json); "sampler" since the
H200 lab run of session 25 (benchmarks/s25_sampler_gpu.py, bit-equal tokens: top-k 50 + top-p +
min-p at B = 1 / 256 23.6 -> 22.1, 71.8-72.1 -> 70.3-70.4 us, B = 64 within the spread;
temperature only at B = 64 94.4 -> 92.2; no mix slower).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...platform import platform_of

# the kernels launched chained (see above), by name; e.g. {"rmsnorm", "act_and_mul", "rope",
# "store_kv", "merge"}. Any iterable of names (benchmarks/serve_ab.py sets a literal).
NAMES = ("rmsnorm", "act_and_mul", "rope", "store_kv", "rope_store_kv", "merge", "moe_routing",
         "moe_router", "moe_direct", "sampler")
CHAIN: frozenset[str] = frozenset(NAMES)
# the compile targets of the chained forms (griddepcontrol: sm_90+)
TARGETS = ("sm_90", "sm_100", "sm_120")


def supported(device: torch.device) -> bool:
    """PDL launches exist: CUDA (not ROCm) sm_90+, a real device (not the interpreter)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    plat = platform_of(device)
    return plat.vendor == "nvidia" and isinstance(plat.arch, int) and plat.arch >= 90


def chained(name: str) -> bool:
    """Whether kernel `name` takes its chained form (CHAIN; the launch adds PDL where
    `supported`)."""
    return name in CHAIN


def launch_args(device: torch.device) -> dict:
    """A chained wrapper's PDL constexpr and launch option on `device`: griddepcontrol and a
    programmatic dependent launch where `supported`, else the plain kernel (the wrapper with
    PDL off, as the interpreter runs it)."""
    on = supported(device)
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def prefetch_l2(ptrs, mask):
    """prefetch.global.L2 of the lines holding ptrs where mask: no register result, nothing
    to wait for. Not pure, so it is kept (and kept in program order with gdc_wait) though its
    dummy result is unused. NVIDIA only (PTX); not in the interpreter."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
