"""Typed descriptions of what a model keeps per token (or per request) between steps.

A model says what its cache holds with one of these values; an engine sizes and allocates the
pool from it and picks the attention ops by its type, never by a string kind:

    spec = GQACacheSpec(num_layers=32, num_kv_heads=8, head_dim=128)
    spec.bytes_per_token(torch.bfloat16)       # 131072
    k, v = spec.allocate(num_pages, page_size, torch.bfloat16, "cuda")

Every kind is paged in equal-size pages of `page_size` tokens, so a scheduler can treat several
kinds as cache groups of one flat page pool. Kinds:
- `GQACacheSpec`: separate K and V per KV head (`tskernels.attention`); `sliding_window` set
  when every layer attends only to its last W keys (pages older than that may be reused).
- `MLACacheSpec`: one compressed latent row (kv_lora_rank + rope_dim) per token
  (`tskernels.mla`).
A recurrent-state kind (GDN / Mamba state slots, one fixed-size state per request rather than
per token) subclasses `KVCacheSpec` with `per_token = False` and its own `allocate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


def _elt(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


@dataclass(frozen=True)
class KVCacheSpec:
    """Base of the cache kinds: `num_layers` layers, each with the same per-token layout."""

    num_layers: int
    per_token: ClassVar[bool] = True

    def __post_init__(self):
        _positive("num_layers", self.num_layers)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes one token occupies across all layers in a `dtype` cache."""
        raise NotImplementedError

    def allocate(self, num_pages: int, page_size: int, dtype: torch.dtype,
                 device: torch.device | str) -> tuple[torch.Tensor, ...]:
        """Zeroed cache tensors of every layer (layer is dim 0)."""
        raise NotImplementedError


@dataclass(frozen=True)
class GQACacheSpec(KVCacheSpec):
    """K and V per KV head: two tensors [num_layers, num_pages, page_size, num_kv_heads,
    head_dim]. sliding_window: every layer attends to its last W keys only (None: all)."""

    num_kv_heads: int = 1
    head_dim: int = 128
    sliding_window: int | None = None

    def __post_init__(self):
        super().__post_init__()
        _positive("num_kv_heads", self.num_kv_heads)
        _positive("head_dim", self.head_dim)
        if self.sliding_window is not None:
            _positive("sliding_window", self.sliding_window)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * _elt(dtype)

    def allocate(self, num_pages, page_size, dtype, device):
        shape = (self.num_layers, num_pages, page_size, self.num_kv_heads, self.head_dim)
        return (torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device))


@dataclass(frozen=True)
class MLACacheSpec(KVCacheSpec):
    """One latent row per token: [num_layers, num_pages, page_size, kv_lora_rank + rope_dim]
    (the compressed KV first, the shared RoPE key last)."""

    kv_lora_rank: int = 512
    rope_dim: int = 64

    def __post_init__(self):
        super().__post_init__()
        _positive("kv_lora_rank", self.kv_lora_rank)
        _positive("rope_dim", self.rope_dim)

    @property
    def width(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.num_layers * self.width * _elt(dtype)

    def allocate(self, num_pages, page_size, dtype, device):
        return (torch.zeros(self.num_layers, num_pages, page_size, self.width, dtype=dtype,
                            device=device),)
