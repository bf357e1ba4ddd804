"""Mixture of experts: routing, align-by-expert, fused experts, weighted combine.

T tokens, E experts, k experts per token, H hidden size, I expert intermediate size.
Routing returns (weights float32 [T, k], ids int32 [T, k]); ids outside [0, E) (e.g. -1 for
experts that live on another rank) are skipped by `align_by_expert` and `fused_experts`.
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from . import (cuda_decode_sm90, reference, triton_align, triton_experts,  # noqa: F401
               triton_route, triton_routing)  # (register)

WEIGHT_DTYPES = (torch.float32, torch.float64)
ACTIVATIONS = ("gelu", "silu")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def _logits(router_logits: torch.Tensor, top_k) -> int:
    _check.tensor("router_logits", router_logits, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    num_experts = router_logits.shape[1]
    _positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(f"top_k: {top_k} exceeds the number of experts ({num_experts})")
    return num_experts


def topk_softmax(router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True,
                 backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing (Mixtral / Qwen-MoE): p = softmax(router_logits); keep the top_k largest,
    divided by their sum when renormalize. Ties go to the lower expert id.

    router_logits: [T, E] fp32/fp16/bf16. top_k: 1 <= top_k <= E.
    Returns (weights float32 [T, top_k], ids int32 [T, top_k]), by descending weight.
    """
    num_experts = _logits(router_logits, top_k)
    kern = select("moe", "topk_softmax", device=router_logits.device,
                  formats={"router_logits": fmt(router_logits.dtype)},
                  traits={"num_experts": num_experts, "top_k": top_k}, backend=backend)
    return kern(router_logits, top_k, renormalize=renormalize)


def rmsnorm_router_topk_softmax(x: torch.Tensor, norm_weight: torch.Tensor,
                                gate_weight: torch.Tensor, top_k: int, *,
                                residual: torch.Tensor | None = None, eps: float = 1e-6,
                                renormalize: bool = True, backend: str | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor,
                                           torch.Tensor]:
    """A softmax-routed MoE block's entry in one op (one launch on the GPU at decode sizes):
    the residual add (when `residual` is given) and RMSNorm, the router projection, and
    softmax top-k routing:

        r = x + residual (rounded to x.dtype);  y = rmsnorm(r or x, norm_weight, eps)
        router_logits = y @ gate_weight^T (rounded to x.dtype, as a linear layer returns them)
        (weights, ids) = topk_softmax(router_logits, top_k, renormalize=renormalize)

    x: [T, H] fp32/fp16/bf16, last dim contiguous. residual: [T, H] like x, or None.
    norm_weight: [H]. gate_weight: [E, H] of x's dtype (a router without bias), last dim
    contiguous. 1 <= top_k <= E.
    Returns (y [T, H], r [T, H] or None, weights float32 [T, top_k], ids int32 [T, top_k]);
    y feeds the experts, r is the residual stream after the add. Ties go to the lower id.
    """
    _check.tensor("x", x, ndim=2, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    tokens, hidden = x.shape
    _check.optional("residual", residual, shape=(tokens, hidden), dtypes=(x.dtype,),
                    device=x.device, contiguous_last=True)
    _check.tensor("norm_weight", norm_weight, ndim=1, dtypes=_check.FLOAT_OR_FP64,
                  shape=(hidden,), device=x.device)
    _check.tensor("gate_weight", gate_weight, ndim=2, dtypes=(x.dtype,), shape=(None, hidden),
                  device=x.device, contiguous_last=True)
    _check.positive("eps", eps)
    num_experts = gate_weight.shape[0]
    _positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(f"top_k: {top_k} exceeds the number of experts ({num_experts})")
    kern = select("moe", "rmsnorm_router_topk_softmax", device=x.device,
                  formats={"x": fmt(x.dtype), "norm_weight": fmt(norm_weight.dtype)},
                  traits={"num_experts": num_experts, "top_k": top_k, "hidden": hidden,
                          "tokens": tokens}, backend=backend)
    return kern(x, norm_weight, gate_weight, top_k, residual=residual, eps=eps,
                renormalize=renormalize)


def topk_sigmoid_grouped(router_logits: torch.Tensor, correction_bias: torch.Tensor, top_k: int,
                         *, n_group: int, topk_group: int, routed_scaling_factor: float = 1.0,
                         renormalize: bool = True, backend: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 grouped sigmoid routing ("noaux_tc"):

        s = sigmoid(logits);  c = s + correction_bias          (c only chooses, never weighs)
        group score = sum of the top-2 c in each of n_group equal groups of experts
        keep the topk_group best groups; choose the top_k experts by c among them
        w = s[chosen] (/ sum(w) if renormalize) * routed_scaling_factor

    router_logits: [T, E] fp32/fp16/bf16. correction_bias: [E] float, same device.
    n_group divides E; 1 <= topk_group <= n_group; 1 <= top_k <= topk_group * E / n_group.
    Returns (weights float32 [T, top_k], ids int32 [T, top_k]), by descending c.
    """
    num_experts = _logits(router_logits, top_k)
    _check.tensor("correction_bias", correction_bias, dtypes=_check.FLOAT_OR_FP64,
                  shape=(num_experts,), device=router_logits.device)
    _positive_int("n_group", n_group)
    if num_experts % n_group:
        raise ValueError(f"n_group: {n_group} does not divide the number of experts "
                         f"({num_experts})")
    _positive_int("topk_group", topk_group)
    if topk_group > n_group:
        raise ValueError(f"topk_group: {topk_group} exceeds n_group ({n_group})")
    reachable = topk_group * (num_experts // n_group)
    if top_k > reachable:
        raise ValueError(f"top_k: {top_k} exceeds the {reachable} experts in the topk_group "
                         f"({topk_group}) kept groups")
    kern = select("moe", "topk_sigmoid_grouped", device=router_logits.device,
                  formats={"router_logits": fmt(router_logits.dtype),
                           "correction_bias": fmt(correction_bias.dtype)},
                  traits={"num_experts": num_experts, "top_k": top_k, "n_group": n_group,
                          "topk_group": topk_group}, backend=backend)
    return kern(router_logits, correction_bias, top_k, n_group=n_group, topk_group=topk_group,
                routed_scaling_factor=routed_scaling_factor, renormalize=renormalize)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_size: int, *,
                    backend: str | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the flat (token * k + slot) indices by expert, each expert's segment padded to a
    multiple of block_size (vLLM/SGLang `moe_align_block_size`).

    Segments follow expert order, indices inside one in increasing order; experts with no
    tokens get no block; ids outside [0, num_experts) are dropped.
    topk_ids: int32/int64 [T, k]. num_experts, block_size: positive ints.
    Returns, on topk_ids' device:
      sorted_token_ids int32 [max_padded], max_padded = T*k + E*(block_size-1) (or
        min(that, T*k*block_size) when T*k < E); the sentinel T*k pads segments and the tail;
      expert_ids int32 [ceil(max_padded / block_size)], -1 past the used blocks;
      num_tokens_post_padded int32 [1].
    """
    _check.tensor("topk_ids", topk_ids, ndim=2, dtypes=_check.INDEX)
    _positive_int("num_experts", num_experts)
    _positive_int("block_size", block_size)
    kern = select("moe", "align_by_expert", device=topk_ids.device,
                  formats={"topk_ids": fmt(topk_ids.dtype)},
                  traits={"num_experts": num_experts, "block_size": block_size},
                  backend=backend)
    return kern(topk_ids, num_experts, block_size)


FP8_WEIGHT_BLOCK = 128


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  activation: str = "silu", w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None, backend: str | None = None
                  ) -> torch.Tensor:
    """out[t] = sum_k topk_weights[t, k] * (act(x[t] W_gate^T) * (x[t] W_up^T)) W2^T, with the
    weights of expert e = topk_ids[t, k]: W_gate = w13[e, :I], W_up = w13[e, I:], W2 = w2[e].
    Ids outside [0, E) contribute nothing. Only the routed (token, expert) rows are computed.

    x: [T, H] fp32/fp16/bf16. w13: [E, 2I, H] (gate rows, then up rows), x's dtype, or
    float8_e4m3fn with w13_scale. w2: [E, H, I], same dtype as w13. topk_weights: float32
    [T, k]. topk_ids: int32/int64 [T, k]. activation: "silu" or "gelu" (tanh approximation).
    Block-fp8 weights (DeepSeek-V3 / HF `weight_scale_inv` layout): w13_scale float32
    [E, ceil(2I/128), ceil(H/128)], w2_scale float32 [E, ceil(H/128), ceil(I/128)], one scale
    per 128 x 128 weight block (dequant(w) = w * scale); activations (x, and the SiLU-mul
    output) are then quantized to e4m3 per 1 x 128 group, as DeepSeek-V3 runs them; x is then
    fp32/fp16/bf16 (the Triton kernels take fp16/bf16). All on one device.
    Returns out [T, H] in x's dtype. No host sync, no data-dependent shape: CUDA-graph safe
    on the Triton backend.
    """
    _check.tensor("x", x, ndim=2, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    tokens, hidden = x.shape
    fp8 = w13.dtype in _check.FP8 if isinstance(w13, torch.Tensor) else False
    wdt = _check.FP8 if fp8 else (x.dtype,)
    _check.tensor("w13", w13, ndim=3, dtypes=wdt, shape=(None, None, hidden), device=x.device)
    num_experts, two_inter, _ = w13.shape
    if two_inter % 2:
        raise ValueError(f"w13: dim 1 holds gate and up rows (2I), must be even, got {two_inter}")
    inter = two_inter // 2
    _check.tensor("w2", w2, dtypes=wdt, shape=(num_experts, hidden, inter), device=x.device)
    if fp8:
        if x.dtype == torch.float64:
            raise TypeError("x: block-fp8 experts take fp32/fp16/bf16 activations, got float64")
        b = FP8_WEIGHT_BLOCK
        _check.tensor("w13_scale", w13_scale, dtypes=(torch.float32,),
                      shape=(num_experts, -(-two_inter // b), -(-hidden // b)), device=x.device)
        _check.tensor("w2_scale", w2_scale, dtypes=(torch.float32,),
                      shape=(num_experts, -(-hidden // b), -(-inter // b)), device=x.device)
    elif w13_scale is not None or w2_scale is not None:
        raise ValueError("w13_scale / w2_scale: only for float8_e4m3fn weights")
    _check.tensor("topk_weights", topk_weights, ndim=2, dtypes=WEIGHT_DTYPES,
                  shape=(tokens, None), device=x.device)
    top_k = topk_weights.shape[1]
    _check.tensor("topk_ids", topk_ids, dtypes=_check.INDEX, shape=(tokens, top_k),
                  device=x.device)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {list(ACTIVATIONS)}, got {activation!r}")
    kern = select("moe", "fused_experts", device=x.device,
                  formats={"x": fmt(x.dtype), "w": fmt(w13.dtype)},
                  traits={"activation": activation, "top_k": top_k,
                          "weight_block": FP8_WEIGHT_BLOCK if fp8 else None,
                          # one token whose shape the one-launch CUDA decode kernel takes
                          "decode_prefetch": cuda_decode_sm90.decode_traits(
                              tokens, hidden, inter, top_k, x.device)},
                  backend=backend)
    if fp8:
        return kern(x, w13, w2, topk_weights, topk_ids, activation=activation,
                    w13_scale=w13_scale, w2_scale=w2_scale)
    return kern(x, w13, w2, topk_weights, topk_ids, activation=activation)


def combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, *,
            backend: str | None = None) -> torch.Tensor:
    """out[t] = sum_k topk_weights[t, k] * expert_out[t, k], accumulated in float32.

    expert_out: [T, k, H] fp32/fp16/bf16. topk_weights: float32 [T, k], same device.
    Returns out [T, H] in expert_out's dtype.
    """
    _check.tensor("expert_out", expert_out, ndim=3, dtypes=_check.FLOAT_OR_FP64)
    tokens, top_k, _ = expert_out.shape
    _check.tensor("topk_weights", topk_weights, dtypes=WEIGHT_DTYPES, shape=(tokens, top_k),
                  device=expert_out.device)
    kern = select("moe", "combine", device=expert_out.device,
                  formats={"expert_out": fmt(expert_out.dtype)}, traits={"top_k": top_k},
                  backend=backend)
    return kern(expert_out, topk_weights)
