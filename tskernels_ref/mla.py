"""Absorbed DeepSeek MLA references over a paged latent cache.

kv_cache [num_pages, page_size, kv_lora_rank + rope_dim] holds, per token, the compressed latent
c_kv (first kv_lora_rank = 512 values) followed by the roped key part (64 values). In the absorbed
form the query already carries W_UK (its first 512 values) and its roped part (last 64), so
    logit_j = scale * q . kv_cache_row_j            (over all 576 values)
    o       = softmax(logits) @ kv_cache_rows[:, :kv_lora_rank]
The cache is shared by all heads (one latent "kv head"). An fp8 cache uses one per-tensor scale.
"""
from __future__ import annotations

import torch

from ._common import compute_dtype, gather_pages, is_fp8


def extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged new tokens attending to their paged latent prefix and themselves.

    Request b owns q rows qo_indptr[b] .. qo_indptr[b+1]-1 (n_b tokens) at positions
    seq_lens[b]-n_b .. seq_lens[b]-1 (already in the cache); with causal, position p sees keys 0..p.
    A query that sees no key gets o = 0.

    Args:
        q: [T, H, kv_lora_rank + rope_dim] (absorbed nope part, then rope part).
        kv_cache: [num_pages, page_size, kv_lora_rank + rope_dim], bf16/fp16/fp32 or fp8-e4m3.
        qo_indptr: int32 [B+1].
        page_table: int32 [B, max_pages].
        seq_lens: int32 [B], prefix + new tokens.
        scale: softmax scale (DeepSeek: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) * mscale^2).
        kv_scale: float32 0-d / [1] per-tensor dequant scale of an fp8 cache (None means 1.0).
    Returns:
        o [T, H, kv_lora_rank] in q.dtype.
    """
    dtype = compute_dtype(q, kv_cache)
    num_tokens, num_heads, _ = q.shape
    o = torch.zeros(num_tokens, num_heads, kv_lora_rank, dtype=dtype, device=q.device)
    bounds = [int(x) for x in qo_indptr.tolist()]
    for b, length in enumerate(int(x) for x in seq_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        n = end - start
        if n == 0 or length == 0:
            continue
        kv = gather_pages(kv_cache, page_table[b], length).to(dtype)
        if is_fp8(kv_cache) and kv_scale is not None:
            kv = kv * torch.as_tensor(kv_scale, dtype=dtype).reshape(())
        logits = torch.einsum("nhc,lc->hnl", q[start:end].to(dtype), kv) * scale
        if causal:
            q_pos = torch.arange(length - n, length, device=q.device)
            visible = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]
            logits = logits.masked_fill(~visible[None], float("-inf"))
        row_max = logits.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        p = torch.exp(logits - row_max)
        denom = p.sum(dim=-1, keepdim=True)
        p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
        o[start:end] = torch.einsum("hnl,lc->nhc", p, kv[:, :kv_lora_rank])
    return o.to(q.dtype)


def decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request over all seq_lens[b] cached latent rows (seq_len 0 -> o = 0).

    Args:
        q: [B, H, kv_lora_rank + rope_dim].
        kv_cache: [num_pages, page_size, kv_lora_rank + rope_dim], bf16/fp16/fp32 or fp8-e4m3.
        page_table: int32 [B, max_pages].
        seq_lens: int32 [B].
        scale, kv_lora_rank, kv_scale: as in `extend`.
    Returns:
        o [B, H, kv_lora_rank] in q.dtype.
    """
    qo_indptr = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return extend(q, kv_cache, qo_indptr, page_table, seq_lens, scale=scale, causal=True,
                  kv_lora_rank=kv_lora_rank, kv_scale=kv_scale)
