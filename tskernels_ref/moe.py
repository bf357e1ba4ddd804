"""Mixture-of-experts references: routing, align-by-expert, fused experts, combine."""
from __future__ import annotations

import torch

from ._common import compute_dtype
from .gemm import quantize_fp8_per_token_group
from .norm import fused_add_rmsnorm, rmsnorm

FP8_BLOCK = 128


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing (Mixtral / Qwen-MoE): p = softmax(logits); keep the top_k largest.

    With renormalize the kept weights are divided by their sum. Ties go to the lower expert id.

    Args:
        router_logits: [T, E], any float dtype.
    Returns:
        (weights float32 [T, top_k], ids int32 [T, top_k]), ordered by descending weight.
    """
    dtype = compute_dtype(router_logits)
    probs = torch.softmax(router_logits.to(dtype), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1, sorted=True)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.float() if dtype != torch.float64 else weights, ids.to(torch.int32)


def rmsnorm_router_topk_softmax(
    x: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor, top_k: int, *,
    residual: torch.Tensor | None = None, eps: float = 1e-6, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """A softmax-routed MoE block's entry: (fused add +) RMSNorm, router projection, top-k.

        residual_out = (x + residual) rounded to x.dtype      (when residual is given)
        y = rmsnorm(residual_out or x, norm_weight, eps)       (x.dtype)
        router_logits = y @ gate_weight^T, rounded to x.dtype  (as a plain linear layer does)
        (weights, ids) = topk_softmax(router_logits, top_k, renormalize)

    Args:
        x: [T, H]; residual: [T, H] or None; norm_weight: [H]; gate_weight: [E, H].
    Returns:
        (y [T, H], residual_out [T, H] or None, weights float32 [T, top_k], ids int32
        [T, top_k]).
    """
    if residual is None:
        y, res = rmsnorm(x, norm_weight, eps), None
    else:
        y, res = fused_add_rmsnorm(x, residual, norm_weight, eps)
    dtype = compute_dtype(y, gate_weight)
    logits = (y.to(dtype) @ gate_weight.to(dtype).T).to(x.dtype)
    weights, ids = topk_softmax(logits, top_k, renormalize=renormalize)
    return y, res, weights, ids


def topk_sigmoid_grouped(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    *,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float = 1.0,
    renormalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 grouped sigmoid routing ("noaux_tc").

        s = sigmoid(logits);  c = s + correction_bias          (c only chooses, never weighs)
        group score = sum of the top-2 c in each of n_group equal expert groups
        keep the topk_group best groups; choose the top_k experts by c among them
        w = s[chosen] (/ sum(w) if renormalize) * routed_scaling_factor

    Args:
        router_logits: [T, E], E % n_group == 0.
        correction_bias: [E] (e_score_correction_bias).
    Returns:
        (weights float32 [T, top_k], ids int32 [T, top_k]), ordered by descending c.
    """
    dtype = compute_dtype(router_logits)
    num_tokens, num_experts = router_logits.shape
    scores = torch.sigmoid(router_logits.to(dtype))
    choice = scores + correction_bias.to(dtype)
    grouped = choice.view(num_tokens, n_group, num_experts // n_group)
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
    keep_groups = group_scores.topk(topk_group, dim=-1).indices
    group_mask = torch.zeros(num_tokens, n_group, dtype=torch.bool, device=scores.device)
    group_mask.scatter_(1, keep_groups, True)
    expert_mask = group_mask.repeat_interleave(num_experts // n_group, dim=1)
    choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * routed_scaling_factor
    return weights.float() if dtype != torch.float64 else weights, ids.to(torch.int32)


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM/SGLang `moe_align_block_size`: group the flat (token * k + slot) indices by expert.

    Each expert's indices (in increasing flat order) form a segment padded with the sentinel
    T*k up to a multiple of block_size; segments follow expert order; experts with no tokens get
    no block. Ids outside [0, num_experts) (e.g. -1 for non-local experts) are dropped.

    Args:
        topk_ids: int [T, k].
    Returns:
        sorted_token_ids: int32 [max_padded], max_padded = T*k + E*(block_size-1)
            (or min of that and T*k*block_size when T*k < E, as vLLM sizes it); entries past
            num_tokens_post_padded are the sentinel.
        expert_ids: int32 [ceil(max_padded / block_size)], expert of each block; -1 past the
            used blocks.
        num_tokens_post_padded: int32 [1], total padded length (a multiple of block_size).
    """
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    max_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    max_blocks = -(-max_padded // block_size)
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32)
    expert_ids = torch.full((max_blocks,), -1, dtype=torch.int32)
    valid = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[valid], minlength=num_experts)
    cursor = 0
    for e in range(num_experts):
        n = int(counts[e])
        if n == 0:
            continue
        sorted_ids[cursor : cursor + n] = torch.nonzero(flat == e).flatten().to(torch.int32)
        padded = -(-n // block_size) * block_size
        expert_ids[cursor // block_size : (cursor + padded) // block_size] = e
        cursor += padded
    return sorted_ids, expert_ids, torch.tensor([cursor], dtype=torch.int32)


def _activation(name: str, gate: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return torch.nn.functional.silu(gate)
    if name == "gelu":
        return torch.nn.functional.gelu(gate, approximate="tanh")
    raise ValueError(f"activation must be 'silu' or 'gelu', got {name!r}")


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * (act(x[t] W_gate^T) * (x[t] W_up^T)) W2^T of expert e = ids[t,k].

    W_gate = w13[e, :I], W_up = w13[e, I:]. The intermediate stays in float32 (ground truth;
    kernels that round it to bf16 differ at bf16 tolerance).

    Block-fp8 weights (float8_e4m3fn w13 / w2 with w13_scale [E, ceil(2I/128), ceil(H/128)]
    and w2_scale [E, ceil(H/128), ceil(I/128)]): dequant(w) = w * scale per 128 x 128 block,
    and the activations are quantized as DeepSeek-V3 runs them: x and the SiLU-mul output
    to e4m3 per 1 x 128 group (`gemm.quantize_fp8_per_token_group`), then dequantized; the
    rest is float32 math.

    Args:
        x: [T, H].
        w13: [E, 2I, H] (gate rows first, then up rows).
        w2: [E, H, I].
        topk_weights: float32 [T, k].
        topk_ids: int32/int64 [T, k].
        activation: "silu" (or "gelu", tanh approximation).
    Returns:
        out [T, H] in x.dtype.
    """
    fp8 = w13_scale is not None
    if fp8:
        w13, w2 = _dequant_blocks(w13, w13_scale), _dequant_blocks(w2, w2_scale)
        x_in = x
        x = _fake_quant(x)
    dtype = compute_dtype(x, w13, w2)
    num_tokens, hidden = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(num_tokens, hidden, dtype=dtype, device=x.device)
    ids = topk_ids.long()
    xf = x.to(dtype)
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= w13.shape[0]:
            continue
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = xf[tok] @ w13[e].to(dtype).T
        act = _activation(activation, h[:, :inter]) * h[:, inter:]
        if fp8:
            act = _fake_quant(act)
        y = act @ w2[e].to(dtype).T
        out.index_add_(0, tok, y * topk_weights[tok, slot].to(dtype)[:, None])
    return out.to(x_in.dtype if fp8 else x.dtype)


def _dequant_blocks(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[E, N, K] e4m3 with [E, ceil(N/128), ceil(K/128)] block scales -> float32."""
    n, k = w.shape[1:]
    s = scale.float().repeat_interleave(FP8_BLOCK, 1)[:, :n].repeat_interleave(FP8_BLOCK, 2)
    return w.float() * s[:, :, :k]


def _fake_quant(a: torch.Tensor) -> torch.Tensor:
    """a quantized to e4m3 per 1 x 128 group and back (float32)."""
    q, s = quantize_fp8_per_token_group(a.float(), FP8_BLOCK)
    return q.float() * s.repeat_interleave(FP8_BLOCK, 1)[:, :a.shape[1]]


def combine(expert_out: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_k topk_weights[t, k] * expert_out[t, k] (float32 accumulation).

    Args:
        expert_out: [T, k, H].
        topk_weights: float32 [T, k].
    Returns:
        out [T, H] in expert_out.dtype.
    """
    dtype = compute_dtype(expert_out, topk_weights)
    out = (expert_out.to(dtype) * topk_weights.to(dtype)[..., None]).sum(dim=1)
    return out.to(expert_out.dtype)
