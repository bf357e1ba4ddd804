"""KV-cache write references: the MLA latent cache (one row of width W per token)."""
from __future__ import annotations

import torch

from ._common import is_fp8, quantize_fp8


def store_mla(
    kv_latent: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Write each new token's latent row into its cache slot, in place.

        kv_cache[slot // page_size, slot % page_size] = kv_latent[t]  (slot = slot_mapping[t] >= 0)

    Negative slots are padding and skipped. An fp8 cache is quantized on write:
    clamp(x / kv_scale, -448, 448) rounded to e4m3; other caches take x cast to their dtype.

    Args:
        kv_latent: [T, W], any float dtype (MLA: W = 576, latent 512 then rope 64).
        kv_cache: [num_pages, page_size, W], written in place.
        slot_mapping: int64 [T], page * page_size + offset, or < 0 to skip.
        kv_scale: float32 0-d / [1] per-tensor scale; used only for an fp8 cache (None = 1.0).
    """
    page_size = kv_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.any()):
        return
    slots = slots[keep]
    rows = kv_latent[keep]
    if is_fp8(kv_cache):
        # quantize_fp8 takes [..., H, D]: one "head" per row, so a per-tensor scale applies.
        rows = quantize_fp8(rows[:, None, :], kv_scale, kv_cache.dtype)[:, 0]
    else:
        rows = rows.to(kv_cache.dtype)
    kv_cache[slots // page_size, slots % page_size] = rows
