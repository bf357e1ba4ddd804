"""One-token fused experts for Hopper (`cuda/moe_decode_sm90.cu`): the whole MoE layer after
routing (gate-up, SiLU-mul, down, weighted combine) in one launch, each CTA's down-weight rows
copied into shared memory by the TMA engine while the CTA streams its gate-up rows, so the
down weights stream during the gate-up instead of after it (the source's header has the
design; benchmarks/RESULTS.md, sessions 31 and 36, the measurements).

Takes one token (a batch-1 decode step), 16-bit weights, SiLU, and shapes whose down rows fit
a CTA's shared memory next to x and the activations: G = top_k x parts CTAs with
parts = SMs // top_k; CTA b holds rows [b R, b R + R), R = ceil(H / G), of every routed
expert's down weight (Qwen3-30B-A3B, H 2048, I 768, top-8 on 132 SMs: 128 CTAs, 16 rows x 8
experts, 192 KB). `fits` is the predicate the registration uses; other problems select the
Triton kernels. Compiled at first use with NVRTC for sm_90a (one build per shape), launched
with the driver API on torch's current stream: no host sync, fixed-size workspace, CUDA-graph
capturable. The arrival counters are a per-device buffer the kernel re-zeroes, so two streams
of one device must not run this kernel concurrently (as triton_direct).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from ...platform import platform_of
from ...registry import Capability, register
from .. import cuda_driver
from ..shared import counters, pdl

SOURCE = Path(__file__).with_name("cuda") / "moe_decode_sm90.cu"
KERNEL = "moe_decode_kernel"
THREADS = 256
SMEM_LIMIT = 232448   # sm_90's opt-in dynamic shared memory per block
CNT_ELEMS = 2       # the grid-wide arrival and its re-arm count (the source's cnt[0], cnt[1])
# launched as a programmatic dependent of the routing (pdl.CHAIN "moe_direct", as the
# Triton decode path), where PDL exists; False: plain launches
PDL = True
# False: the trait says no, so the selector never takes this kernel (serving A/B switch)
ENABLED = True
_work: dict[tuple, tuple[torch.Tensor]] = {}


def rows_per_cta(hidden: int, top_k: int, parts: int) -> int:
    return -(-hidden // (top_k * parts))


def smem_bytes(hidden: int, inter: int, top_k: int, parts: int) -> int:
    """The source's SMEM_BYTES: every slot's down rows (top_k x R x I 16-bit), x as fp32, the
    activation rows (top_k x I 16-bit), the partials (top_k x R fp32), the mbarrier."""
    rows = rows_per_cta(hidden, top_k, parts)
    part = top_k * rows * inter * 2 + hidden * 4 + top_k * inter * 2
    return (part + top_k * rows * 4 + 7) // 8 * 8 + 8


def parts_for(top_k: int, sms: int) -> int:
    return sms // top_k


def fits(hidden: int, inter: int, top_k: int, sms: int) -> bool:
    """Whether the kernel takes this shape on a device with `sms` SMs: H and I multiples of
    256, at least one part per slot, the rows within the shared-memory limit, the grid (which
    spins on its own CTAs) no larger than the SM count, and the copied bytes within one
    mbarrier transaction count."""
    parts = parts_for(top_k, sms)
    if hidden % 256 or inter % 256 or parts < 1 or top_k * parts > sms:
        return False
    rows = rows_per_cta(hidden, top_k, parts)
    return smem_bytes(hidden, inter, top_k, parts) <= SMEM_LIMIT and \
        top_k * rows * inter * 2 < (1 << 20)


def decode_traits(tokens: int, hidden: int, inter: int, top_k: int,
                  device: torch.device) -> bool:
    """The `decode_prefetch` trait moe.fused_experts passes: one token on a CUDA device whose
    SM count lets `fits` take the shape (False elsewhere, so other backends are unaffected)."""
    if not ENABLED or tokens != 1 or device.type != "cuda" or _sm_share_limited():
        return False
    return fits(hidden, inter, top_k, platform_of(device).num_sms)


def _sm_share_limited() -> bool:
    """An MPS client limited to part of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE < 100): the
    device still reports all of them, but the grid, which spins on its own CTAs, might not be
    resident at once, so the kernel is not offered there."""
    v = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    try:
        return v is not None and float(v) < 100
    except ValueError:
        return True


def nvcc_options(hidden: int, inter: int, top_k: int, parts: int, half: bool,
                 ids64: bool) -> tuple[str, ...]:
    return ("-std=c++17", cuda_driver.INCLUDE, f"-DHID={hidden}", f"-DINTER={inter}",
            f"-DTOPK={top_k}", f"-DPARTS={parts}", *(("-DHALF",) if half else ()),
            *(("-DIDS64",) if ids64 else ()))


def _counters(device: torch.device) -> torch.Tensor:
    """The device's arrival counters (shared/counters.py); the kernel re-zeroes what it used."""
    return counters.zeroed(__name__, device, CNT_ELEMS)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t contiguous with a 16-byte-aligned base (the kernel's vector loads and bulk copies);
    else a copy."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def run(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor, extra: tuple[str, ...] = ()) -> torch.Tensor:
    """out [1, H] (x's dtype) for x [1, H], w13 [E, 2I, H], w2 [E, H, I] (x's dtype),
    topk_weights [1, k], topk_ids int32 / int64 [1, k]. extra: more -D options (lab variants,
    e.g. -DLATE_COPY: the down rows copied after the wait)."""
    dev = x.device
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter, top_k = two_inter // 2, topk_ids.shape[1]
    sms = platform_of(dev).num_sms
    if tokens != 1 or not fits(hidden, inter, top_k, sms) or x.dtype not in \
            (torch.bfloat16, torch.float16) or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"CUDA decode MoE: one token, 16-bit x / weights and a shape that "
                         f"fits (H {hidden}, I {inter}, top-{top_k} on {sms} SMs); got "
                         f"T {tokens}, {x.dtype} / {w13.dtype}")
    parts = parts_for(top_k, sms)
    smem = smem_bytes(hidden, inter, top_k, parts)
    ids64 = topk_ids.dtype == torch.int64
    chained = PDL and pdl.supported(dev) and pdl.chained("moe_direct")
    opts = nvcc_options(hidden, inter, top_k, parts, x.dtype == torch.float16, ids64) + extra \
        + (("-DPDL",) if chained else ())
    fn = cuda_driver.sm90a_function(dev, SOURCE, KERNEL, opts, smem, "CUDA decode MoE")
    x, w13, w2 = _aligned(x), _aligned(w13), _aligned(w2)
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    tw = topk_weights if topk_weights.dtype == torch.float32 and \
        topk_weights.is_contiguous() else topk_weights.float().contiguous()
    key = (dev, hidden, inter, top_k, x.dtype)
    if key not in _work:   # the activation rows (16-bit): reused, rewritten by every launch
        _work[key] = (torch.empty(top_k, inter, dtype=x.dtype, device=dev),)
    act, = _work[key]
    out = torch.empty(1, hidden, dtype=x.dtype, device=dev)
    ptr = ctypes.c_uint64
    args = (ptr(x.data_ptr()), ptr(w13.data_ptr()), ptr(w2.data_ptr()), ptr(tw.data_ptr()),
            ptr(ids.data_ptr()), ptr(act.data_ptr()), ptr(_counters(dev).data_ptr()),
            ptr(out.data_ptr()), ctypes.c_int(num_experts))
    cuda_driver.launch(fn, top_k * parts, THREADS, smem, dev, args, pdl=chained)
    return out


@register("moe", "fused_experts", backend="cuda_sm90",
          capability=Capability(vendors=frozenset({"nvidia"}), min_sm=90, max_sm=90,
                                features=frozenset({"tma"}),
                                modules=frozenset({"cuda.bindings"})),
          formats={"x": ("bf16", "fp16"), "w": ("bf16", "fp16")},
          traits={"activation": ("silu",), "weight_block": (None,),
                  "decode_prefetch": (True,)},
          band="specialized", tags=("deterministic",), compiled=("sm_90",),
          description="CUDA one-token fused experts (sm_90a): one launch, each CTA's down "
                      "rows TMA-copied into shared memory while it streams its gate-up rows.")
def fused_experts(x, w13, w2, topk_weights, topk_ids, *, activation):
    """CUDA decode MoE (sm_90a): T = 1, 16-bit weights, SiLU."""
    return run(x, w13, w2, topk_weights, topk_ids)
