"""Benchmarks of the moe family: the whole routed-expert layer (routing from the router logits
+ align + gate-up + SiLU-mul + down + combine), E=128, top-8, hidden 2048, intermediate 768,
bf16 (Qwen3-30B-A3B's layer), against

- vllm_triton: vLLM's Triton fused-MoE GEMM kernel with its tuned H200 table for this shape
  (E=128, N=768), run standalone from a copy in an ignored folder (VLLM_MOE_DIR, default
  .whl/vllm_moe; absent: the baseline is left out). Around its two GEMMs it gets our Triton
  routing and align (vLLM's own are CUDA ops of its extension), tskernels' silu_and_mul and
  a torch sum over the k slots, as vLLM's fused_experts does with its moe_sum.
- vllm_gemms: the same two vLLM GEMM launches alone, inputs aligned beforehand (the figure
  ../shared/H200.md quotes).
- grouped_mm: `torch._grouped_mm` over the tokens sorted by expert (torch sort / scatter).
- per_expert_loop: one torch matmul pair per expert that has tokens (host syncs: eager only).
- aligned_path (GPU): our Triton layer without the decode-size path (align + grouped GEMMs +
  combine, 16-token routing programs), the design the decode path replaced at small T.
- direct_token_down (GPU): the decode path with its per-token down variant.

Every input set holds its own copy of the expert weights (1.2 GB), so rotating sets means T=1
reads its 8 experts from HBM, not L2. FLOPs count the routed rows only; bytes count the
weights of the experts the routing touched (expected value for random routing) plus x / out.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tskernels

from ..core import Bench, register_bench

DTYPE = torch.bfloat16
QWEN3 = dict(E=128, k=8, H=2048, I=768)
SHAPES = [{"T": t, **QWEN3} for t in (1, 64, 1024, 8192)]
CPU_SHAPES = [{"T": 4, "E": 8, "k": 2, "H": 64, "I": 32}]


def _make(shape, device, gen):
    t, e, h, i = shape["T"], shape["E"], shape["H"], shape["I"]
    return {
        "x": torch.randn(t, h, device=device, generator=gen).to(DTYPE),
        "logits": torch.randn(t, e, device=device, generator=gen),
        "w13": (torch.randn(e, 2 * i, h, device=device, generator=gen) / h ** 0.5).to(DTYPE),
        "w2": (torch.randn(e, h, i, device=device, generator=gen) / i ** 0.5).to(DTYPE),
        "k": shape["k"],
    }


def _ours(d):
    w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
    return tskernels.moe.fused_experts(d["x"], d["w13"], d["w2"], w, ids)


def _vllm_module():
    root = Path(os.environ.get("VLLM_MOE_DIR", Path(__file__).resolve().parents[3] / ".whl"
                               / "vllm_moe"))
    path = root / "vllm_fused_moe.py"
    if not path.exists():
        return None
    if "vllm_fused_moe" not in sys.modules:
        spec = importlib.util.spec_from_file_location("vllm_fused_moe", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["vllm_fused_moe"] = mod
    return sys.modules["vllm_fused_moe"]


def _vllm_gemms(v, d, w, sorted_ids, expert_ids, total, cfg, cache1, cache2, cache3):
    v.invoke_fused_moe_kernel(d["x"], d["w13"], cache1, w, sorted_ids, expert_ids, total,
                              False, d["k"], cfg)
    tskernels.activation.silu_and_mul(cache1.view(-1, cache1.shape[-1]), out=cache2)
    v.invoke_fused_moe_kernel(cache2, d["w2"], cache3, w, sorted_ids, expert_ids, total, True,
                              1, cfg)


def _vllm_layer(d):
    v = _vllm_module()
    t, h = d["x"].shape
    e, two_i, _ = d["w13"].shape
    cfg = v.get_config(t)
    w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
    sorted_ids, expert_ids, total = tskernels.moe.align_by_expert(ids, e, cfg["BLOCK_SIZE_M"])
    c1 = torch.empty(t, d["k"], two_i, dtype=DTYPE, device=d["x"].device)
    c2 = torch.empty(t * d["k"], two_i // 2, dtype=DTYPE, device=d["x"].device)
    c3 = torch.empty(t, d["k"], h, dtype=DTYPE, device=d["x"].device)
    _vllm_gemms(v, d, w, sorted_ids, expert_ids, total, cfg, c1, c2, c3)
    return c3.sum(dim=1)


def _vllm_prepare(d):
    """Routing, alignment and buffers for the GEMM-only baseline, made once per input set."""
    v = _vllm_module() if d["x"].is_cuda else None
    if v is None:
        return d
    t, h = d["x"].shape
    e, two_i, _ = d["w13"].shape
    cfg = v.get_config(t)
    w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
    d = dict(d, v_cfg=cfg, v_w=w, v_align=tskernels.moe.align_by_expert(ids, e,
                                                                         cfg["BLOCK_SIZE_M"]))
    dev = d["x"].device
    d["v_c1"] = torch.empty(t, d["k"], two_i, dtype=DTYPE, device=dev)
    d["v_c2"] = torch.empty(t * d["k"], two_i // 2, dtype=DTYPE, device=dev)
    d["v_c3"] = torch.empty(t, d["k"], h, dtype=DTYPE, device=dev)
    return d


def _vllm_gemms_only(d):
    _vllm_gemms(_vllm_module(), d, d["v_w"], *d["v_align"], d["v_cfg"], d["v_c1"], d["v_c2"],
                d["v_c3"])


def _grouped_mm(d):
    x, w13, w2 = d["x"], d["w13"], d["w2"]
    t, h = x.shape
    e = w13.shape[0]
    w, ids = torch.topk(torch.softmax(d["logits"], -1), d["k"], dim=-1)
    w = w / w.sum(-1, keepdim=True)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[order // d["k"]]
    hgu = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
    i = hgu.shape[1] // 2
    act = F.silu(hgu[:, :i]) * hgu[:, i:]
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)
    y = y * w.reshape(-1)[order, None].to(y.dtype)
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    out.index_add_(0, order // d["k"], y.float())
    return out.to(DTYPE)


def _per_expert_loop(d):
    x, w13, w2 = d["x"], d["w13"], d["w2"]
    w, ids = torch.topk(torch.softmax(d["logits"], -1), d["k"], dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    i = w13.shape[1] // 2
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        hgu = x[tok] @ w13[e].T
        y = (F.silu(hgu[:, :i]) * hgu[:, i:]) @ w2[e].T
        out.index_add_(0, tok, y.float() * w[tok, slot, None])
    return out.to(DTYPE)


def _touched_experts(s) -> float:
    """Expected number of experts random top-k routing of T tokens touches."""
    return s["E"] * (1 - (1 - s["k"] / s["E"]) ** s["T"])


def _bytes(s):
    per_expert = 3 * s["H"] * s["I"] * DTYPE.itemsize
    return int(_touched_experts(s) * per_expert + 2 * s["T"] * s["H"] * DTYPE.itemsize)


def _flops(s):
    return 2 * s["T"] * s["k"] * 3 * s["H"] * s["I"]


def _aligned_path(d):
    """Our Triton layer as it ran before the decode path: four-warp 16-token routing
    programs, align + grouped gate-up + down + combine at every T."""
    from tskernels.ops.moe import triton_experts, triton_routing

    keep = triton_routing.DECODE_TOKENS
    triton_routing.DECODE_TOKENS = 0
    try:
        w, ids = triton_routing.topk_softmax(d["logits"], d["k"], renormalize=True)
    finally:
        triton_routing.DECODE_TOKENS = keep
    tiles = triton_experts.tiles_for(d["x"].shape[0], False)
    return triton_experts.experts(d["x"], d["w13"], d["w2"], w, ids, tiles=tiles)


def _direct_token_down(d):
    """The align-free decode path with the per-token down (k slots in one loop) instead of
    the per-slot down with the fused last-arrival sum."""
    from tskernels.ops.moe import triton_direct

    w, ids = tskernels.moe.topk_softmax(d["logits"], d["k"])
    return triton_direct.direct_experts(d["x"], d["w13"], d["w2"], w, ids,
                                        tiles=triton_direct.TOKEN_DOWN)


_baselines = {"grouped_mm": _grouped_mm, "per_expert_loop": _per_expert_loop}
if torch.cuda.is_available():
    _baselines.update(aligned_path=_aligned_path, direct_token_down=_direct_token_down)
if torch.cuda.is_available() and _vllm_module() is not None:
    _baselines = {"vllm_triton": _vllm_layer, "vllm_gemms": _vllm_gemms_only, **_baselines}

register_bench(Bench(
    "moe.fused_layer", SHAPES, _make, ours=_ours, baselines=_baselines, bytes=_bytes,
    flops=_flops, prepare=_vllm_prepare, cpu_shapes=CPU_SHAPES))
