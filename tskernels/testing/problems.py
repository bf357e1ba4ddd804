"""Generators of *valid* kernel problems, hostile where the contract allows it.

Paged KV: pages handed out in a random order (permuted page tables), every slot no sequence
owns (unused pages, the tail of each last page, page 0, page-table padding) poisoned with NaN,
so a kernel that reads past a sequence's length or through a wrong page index produces NaN
instead of a plausible number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import plan

POISON = float("nan")


@dataclass(frozen=True)
class PagedKV(plan.PagedKV):
    """`tskernels.plan.PagedKV` with the dense view the tests compare against. k_cache,
    v_cache: [num_pages, page_size, num_kv_heads, head_dim]; page_table: int32 [batch,
    max_pages]; seq_lens: int32 [batch]. Page 0 is never handed out (the null page)."""

    def dense(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request b's K and V gathered into [seq_len, num_kv_heads, head_dim] (dequantized)."""
        n = int(self.seq_lens[b])
        pages = self.page_table[b, : math.ceil(n / self.page_size)].long()
        out = []
        for cache, scale in ((self.k_cache, self.k_scale), (self.v_cache, self.v_scale)):
            x = cache[pages].reshape(-1, *cache.shape[2:])[:n].float()
            if scale is not None:
                x = x * scale.float().reshape(-1, 1) if scale.numel() > 1 else x * scale.float()
            out.append(x)
        return out[0], out[1]


def ragged_lens(batch: int, max_len: int, *, gen: torch.Generator | None = None,
                include_edges: bool = True) -> list[int]:
    """Random lengths in [0, max_len]; with include_edges the first entries are 0 and 1."""
    lens = torch.randint(0, max_len + 1, (batch,), generator=gen).tolist()
    if include_edges:
        for i, v in enumerate((0, 1)[: batch]):
            lens[i] = min(v, max_len)
    return lens


def paged_kv(seq_lens: list[int], page_size: int, num_kv_heads: int, head_dim: int,
             dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu", *,
             extra_pages: int = 3, permute: bool = True, poison: bool = True,
             kv_dtype: torch.dtype | None = None, per_head_scale: bool = False,
             gen: torch.Generator | None = None) -> PagedKV:
    """A paged K/V cache holding random keys/values for sequences of `seq_lens` tokens.

    kv_dtype=torch.float8_e4m3fn stores the cache in fp8 with per-tensor (or per-head) scales.
    """
    needed = [math.ceil(n / page_size) for n in seq_lens]
    num_pages = 1 + sum(needed) + extra_pages
    order = (torch.randperm(num_pages - 1, generator=gen) + 1) if permute \
        else torch.arange(1, num_pages)
    max_pages = max([1, *needed])
    table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(needed):
        table[b, :n] = order[pos: pos + n].to(torch.int32)
        pos += n
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    caches = [torch.randn(shape, generator=gen, dtype=torch.float32) for _ in range(2)]
    if poison:
        owned = torch.zeros(num_pages, page_size, dtype=torch.bool)
        for b, n in enumerate(seq_lens):
            slots = torch.arange(n)
            owned[table[b, slots // page_size].long(), slots % page_size] = True
        for c in caches:
            c[~owned] = POISON
    scales = [None, None]
    kv_dtype = kv_dtype or dtype
    if kv_dtype == torch.float8_e4m3fn:
        for i, c in enumerate(caches):
            amax = c.nan_to_num(0).abs().amax(dim=(0, 1, 3)) if per_head_scale \
                else c.nan_to_num(0).abs().amax().reshape(1)
            s = (amax.clamp_min(1e-6) / 448.0).float()
            view = s.reshape(1, 1, -1, 1) if per_head_scale else s
            caches[i] = (c / view).clamp(-448, 448)
            scales[i] = s.to(device)
    k, v = (c.to(device=device, dtype=kv_dtype) for c in caches)
    return PagedKV(k_cache=k, v_cache=v, page_table=table.to(device),
                   seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                   k_scale=scales[0], v_scale=scales[1])


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer pre-filled with NaN: a kernel that skips an element leaves NaN behind."""
    return torch.full_like(t, POISON)
