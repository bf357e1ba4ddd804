"""Reference backend of the kvcache family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.kvcache as ref

from ...registry import register
from .._common import REF


@register("kvcache", "store_mla", **REF)
def store_mla(kv_latent, kv_cache, slot_mapping, *, kv_scale=None):
    ref.store_mla(kv_latent, kv_cache, slot_mapping, kv_scale=kv_scale)
