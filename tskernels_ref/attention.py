"""Paged attention references: store_kv, rope_store_kv, decode, extend, merge_states.

Cache layout (per layer): k_cache, v_cache [num_pages, page_size, num_kv_heads, head_dim] (NHD),
bf16/fp16/fp32 or float8_e4m3fn with a float32 scale, per-tensor (0-d / 1 element) or
per-head [num_kv_heads]; dequant = fp8.float() * scale. Request b's tokens live in pages
page_table[b, 0], page_table[b, 1], ... in order; only the first ceil(seq_lens[b] / page_size)
entries are read, so the rest of the row and all other pages may hold garbage (even NaN).
"""
from __future__ import annotations

import math

import torch

from ._common import compute_dtype, dequant, gather_pages, is_fp8, quantize_fp8
from .norm import rmsnorm
from .rope import apply_rope


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write the new tokens' K/V into their cache slots, in place.

    k_cache[slot // page_size, slot % page_size] = k[t] for every t with slot = slot_mapping[t] >= 0
    (negative slots are padding and skipped); same for v. An fp8 cache is quantized on write:
    clamp(x / scale, -448, 448) rounded to e4m3.

    Args:
        k, v: [T, num_kv_heads, head_dim], any float dtype.
        k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim], written in place.
        slot_mapping: int64 [T], page * page_size + offset, or < 0 to skip.
        k_scale, v_scale: float32 0-d / [1] / [num_kv_heads]; used only for an fp8 cache
            (None means 1.0).
    """
    page_size = k_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.any()):
        return
    slots = slots[keep]
    page, offset = slots // page_size, slots % page_size
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        x = src[keep]
        x = quantize_fp8(x, scale, cache.dtype) if is_fp8(cache) else x.to(cache.dtype)
        cache[page, offset] = x


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    style: str = "neox",
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A decode step's q/k preparation and K/V write: per-head RMSNorm of q and k (when the
    weights are given, as Qwen3 does), RoPE of q and k, then `store_kv` of the rotated k and v.

    Exactly the composition of the separate references, intermediate roundings included: the
    normed q / k are rounded to their dtype before RoPE reads them (`rmsnorm`), the rotated
    ones before the store (`apply_rope`), and the store casts to the cache dtype.

    Args:
        q: [T, Hq, D]; k, v: [T, Hkv, D], all one float dtype.
        positions: int32/int64 [T]; cos_sin_cache: [max_position, r] (r <= D, even).
        k_cache, v_cache: [num_pages, page_size, Hkv, D] (16-bit or fp32), written in place.
        slot_mapping: int64 [T], or < 0 to skip the token's K/V (padding).
        q_norm_weight, k_norm_weight: [D] or None (both or neither).
    Returns:
        q_out [T, Hq, D] in q's dtype (normed and rotated; a new tensor).
    """
    if q_norm_weight is not None:
        q = rmsnorm(q, q_norm_weight, eps)
    if k_norm_weight is not None:
        k = rmsnorm(k, k_norm_weight, eps)
    q_out, k_out = apply_rope(q, k, positions, cos_sin_cache, style=style)
    store_kv(k_out, v, k_cache, v_cache, slot_mapping)
    return q_out


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of n queries over L keys of one request (all tensors in the compute dtype).

    q [n, Hq, D], k/v [L, Hkv, D], q_pos int64 [n] -> (o [n, Hq, D], lse [n, Hq]).
    """
    n, num_q_heads, _ = q.shape
    length, num_kv_heads, _ = k.shape
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    logits = torch.einsum("nhd,lhd->hnl", q, k) * scale
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    key_pos = torch.arange(length, device=q.device)
    allowed = torch.ones(n, length, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= key_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None and sliding_window > 0:
        allowed &= key_pos[None, :] > q_pos[:, None] - sliding_window
    logits = logits.masked_fill(~allowed[None], float("-inf"))
    row_max = logits.amax(dim=-1) if length else torch.full((num_q_heads, n), float("-inf"), dtype=q.dtype)
    if sinks is not None:
        sink = sinks.to(q.dtype)[:, None].expand(num_q_heads, n)
        row_max = torch.maximum(row_max, sink)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(logits - row_max[..., None])
    denom = p.sum(dim=-1)
    if sinks is not None:
        denom = denom + torch.exp(sink - row_max)
    o = torch.einsum("hnl,lhd->nhd", p, v)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    o = o / safe.transpose(0, 1)[..., None]
    lse = torch.where(denom > 0, row_max + torch.log(safe), torch.full_like(denom, float("-inf")))
    return o, lse.transpose(0, 1)


def extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """New tokens of a ragged batch attending to their paged prefix and themselves.

    Request b owns q rows qo_indptr[b] .. qo_indptr[b+1]-1 (n_b tokens) at positions
    seq_lens[b]-n_b .. seq_lens[b]-1; their K/V are already in the cache. For query position p
    and key position j < seq_lens[b]:
        s_j = scale * q . K_j            (query head h reads kv head h // (Hq // Hkv))
        s_j = softcap * tanh(s_j / softcap)                      if softcap
        keep j iff (j <= p or not causal) and (j > p - W if sliding_window=W)
        o = sum_j exp(s_j) V_j / (sum_j exp(s_j) + exp(sinks[h]))  (sink term only if sinks)
    A query with no visible key (and no sink) gets o = 0.

    Args:
        q: [T, Hq, D] ragged queries, T = qo_indptr[-1].
        k_cache, v_cache: [num_pages, page_size, Hkv, D]; Hq % Hkv == 0.
        qo_indptr: int32 [B+1].
        page_table: int32 [B, max_pages].
        seq_lens: int32 [B], prefix + new tokens.
        scale: softmax scale, default 1/sqrt(D).
        sliding_window: W > 0 keeps only the last W keys up to the query (None/<=0: off).
        softcap: c > 0 caps logits with c*tanh(s/c) after scaling (None/0: off).
        sinks: float32 [Hq], one extra logit per head in the softmax denominator only.
        k_scale, v_scale: float32 0-d / [1] / [Hkv] dequant scales of an fp8 cache.
        return_lse: also return lse float32 (float64 for float64 q) [T, Hq], natural-log normalizer (incl. the sink),
            -inf for a query that sees nothing.
    Returns:
        o [T, Hq, D] in q.dtype (and lse if asked).
    """
    dtype = compute_dtype(q, k_cache, v_cache)
    head_dim = q.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    o = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    lse = torch.full(q.shape[:2], float("-inf"), dtype=lse_dtype, device=q.device)
    bounds = [int(x) for x in qo_indptr.tolist()]
    for b, length in enumerate(int(x) for x in seq_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        n = end - start
        if n == 0:
            continue
        k = dequant(gather_pages(k_cache, page_table[b], length), k_scale, dtype)
        v = dequant(gather_pages(v_cache, page_table[b], length), v_scale, dtype)
        q_pos = torch.arange(length - n, length, device=q.device)
        o_b, lse_b = _attend(
            q[start:end].to(dtype), k, v, q_pos, causal=causal, scale=scale,
            sliding_window=sliding_window, softcap=softcap, sinks=sinks,
        )
        o[start:end], lse[start:end] = o_b, lse_b.to(lse_dtype)
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One query token per request attending to all seq_lens[b] cached keys (its own included).

    Same math as `extend` with one new token per request at position seq_lens[b] - 1; a request
    with seq_len 0 gets o = 0.

    Args:
        q: [B, Hq, D].
        k_cache, v_cache: [num_pages, page_size, Hkv, D]; Hq % Hkv == 0.
        page_table: int32 [B, max_pages].
        seq_lens: int32 [B].
        scale, sliding_window, softcap, sinks, k_scale, v_scale, return_lse: as in `extend`.
    Returns:
        o [B, Hq, D] in q.dtype (and lse float32 [B, Hq] if asked).
    """
    batch = q.shape[0]
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32)
    return extend(
        q, k_cache, v_cache, qo_indptr, page_table, seq_lens, causal=True, scale=scale,
        sliding_window=sliding_window, softcap=softcap, sinks=sinks, k_scale=k_scale,
        v_scale=v_scale, return_lse=return_lse,
    )


def merge_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax-attention results over disjoint key sets (split-KV).

        lse = log(exp(lse_a) + exp(lse_b))
        o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b
    A side with lse = -inf (no keys) contributes nothing; both -inf gives o = 0, lse = -inf.

    Args:
        o_a, o_b: [N, H, D], any float dtype.
        lse_a, lse_b: float32 [N, H], natural log.
    Returns:
        (o [N, H, D] in o_a.dtype, lse float32 [N, H]).
    """
    dtype = compute_dtype(o_a, o_b, lse_a, lse_b)
    la, lb = lse_a.to(dtype), lse_b.to(dtype)
    lse = torch.logaddexp(la, lb)
    empty = torch.isneginf(lse)
    ref = torch.where(empty, torch.zeros_like(lse), lse)
    wa = torch.where(empty, torch.zeros_like(lse), torch.exp(la - ref))
    wb = torch.where(empty, torch.zeros_like(lse), torch.exp(lb - ref))
    o = wa[..., None] * o_a.to(dtype) + wb[..., None] * o_b.to(dtype)
    return o.to(o_a.dtype), lse.to(lse_a.dtype)
