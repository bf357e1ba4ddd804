"""KV-cache writes that are not attention's K/V pair: the MLA latent cache.

MLA cache layout per layer: kv_cache [num_pages, page_size, W] (W = 576 for DeepSeek: latent
512 then rope 64), bf16/fp16/fp32, or fp8-e4m3 with a per-tensor float32 kv_scale.
slot_mapping int64 [T] = page * page_size + offset; negative slots are padding.
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from .._common import load_backends

BACKENDS = load_backends(__name__, __path__)

CACHE_DTYPES = _check.FLOAT_OR_FP64 + _check.FP8


def store_mla(kv_latent: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
              kv_scale: torch.Tensor | None = None, backend: str | None = None) -> None:
    """Write each new token's latent row into its cache slot, in place:

        kv_cache[slot // page_size, slot % page_size] = kv_latent[t]  (slot = slot_mapping[t] >= 0)

    kv_latent: [T, W] fp32/fp16/bf16 (last dim contiguous). kv_cache: contiguous
    [num_pages, page_size, W], bf16/fp16/fp32 (values cast on write) or float8_e4m3fn
    (quantized on write: clamp(x / kv_scale, +-448) -> e4m3). slot_mapping: int64 [T],
    distinct non-negative slots below num_pages * page_size, negative = skip (the upper
    bound is checked only when slot_mapping is on the CPU: elsewhere it would synchronise).
    kv_scale: float32 0-d or [1]; required for an fp8 cache, ignored otherwise.
    All on one device.
    """
    _check.tensor("kv_latent", kv_latent, ndim=2, dtypes=_check.FLOAT_OR_FP64,
                  contiguous_last=True)
    tokens, width = kv_latent.shape
    _check.tensor("kv_cache", kv_cache, ndim=3, dtypes=CACHE_DTYPES, shape=(None, None, width),
                  device=kv_latent.device)
    if not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache: must be contiguous, got strides {kv_cache.stride()}")
    _check.tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,), shape=(tokens,),
                  device=kv_latent.device)
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    if slot_mapping.device.type == "cpu" and tokens and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping: expected slots below num_pages * page_size = "
                         f"{num_slots}, got max {int(slot_mapping.max())}")
    fp8 = kv_cache.dtype in _check.FP8
    if kv_scale is None and fp8:
        raise ValueError("kv_scale: required when kv_cache is fp8")
    if kv_scale is not None:
        _check.tensor("kv_scale", kv_scale, dtypes=(torch.float32,), device=kv_latent.device)
        if kv_scale.numel() != 1 or kv_scale.dim() > 1:
            raise ValueError(f"kv_scale: expected one per-tensor value (shape () or (1,)), "
                             f"got shape {tuple(kv_scale.shape)}")
    kv = fmt(kv_cache.dtype) + (":per_tensor" if fp8 else "")
    kern = select("kvcache", "store_mla", device=kv_latent.device,
                  formats={"kv_latent": fmt(kv_latent.dtype), "kv": kv},
                  traits={"width": width, "page_size": kv_cache.shape[1]}, backend=backend)
    kern(kv_latent, kv_cache, slot_mapping, kv_scale=kv_scale)
