"""Reference backend of the moe family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.moe as ref

from ...registry import register
from .._common import REF


@register("moe", "topk_softmax", **REF)
def topk_softmax(router_logits, top_k, *, renormalize):
    return ref.topk_softmax(router_logits, top_k, renormalize=renormalize)


@register("moe", "rmsnorm_router_topk_softmax", **REF)
def rmsnorm_router_topk_softmax(x, norm_weight, gate_weight, top_k, *, residual, eps,
                                renormalize):
    return ref.rmsnorm_router_topk_softmax(x, norm_weight, gate_weight, top_k,
                                           residual=residual, eps=eps,
                                           renormalize=renormalize)


@register("moe", "topk_sigmoid_grouped", **REF)
def topk_sigmoid_grouped(router_logits, correction_bias, top_k, **kw):
    return ref.topk_sigmoid_grouped(router_logits, correction_bias, top_k, **kw)


@register("moe", "align_by_expert", **REF)
def align_by_expert(topk_ids, num_experts, block_size):
    # The reference builds its outputs on the CPU; hand them back where the ids live.
    out = ref.align_by_expert(topk_ids.cpu(), num_experts, block_size)
    return tuple(t.to(topk_ids.device) for t in out)


@register("moe", "fused_experts", **REF)
def fused_experts(x, w13, w2, topk_weights, topk_ids, *, activation, w13_scale=None,
                  w2_scale=None):
    return ref.fused_experts(x, w13, w2, topk_weights, topk_ids, activation=activation,
                             w13_scale=w13_scale, w2_scale=w2_scale)


@register("moe", "combine", **REF)
def combine(expert_out, topk_weights):
    return ref.combine(expert_out, topk_weights)
