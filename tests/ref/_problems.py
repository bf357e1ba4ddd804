"""Valid-problem generators for the reference tests: paged caches with permuted page tables,
NaN-filled unused pages and ragged lengths, plus hypothesis strategies for their shapes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

HEAD_DIMS = st.one_of(st.sampled_from([8, 16, 32]), st.sampled_from([64, 128, 256]))
GQA_GROUPS = st.sampled_from([1, 2, 3, 4, 8, 16])
PAGE_SIZES = st.sampled_from([1, 2, 3, 4, 16])


def rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


@dataclass
class Paged:
    """A paged cache holding `dense[b]` (float64 [L_b, *row]) for each request b."""

    cache: torch.Tensor  # [num_pages, page_size, *row], NaN outside the requests' tokens
    page_table: torch.Tensor  # int32 [B, max_pages]
    seq_lens: torch.Tensor  # int32 [B]


def build_paged(dense: list[torch.Tensor], page_size: int, dtype: torch.dtype, gen: torch.Generator,
                *, extra_pages: int = 2) -> Paged:
    """Scatter each request's rows over a random permutation of pages; everything else is NaN.

    Page-table entries past a request's pages point at random (maybe NaN) pages, as real
    engines leave stale ids there.
    """
    row_shape = dense[0].shape[1:] if dense else ()
    pages_needed = [-(-d.shape[0] // page_size) for d in dense]
    num_pages = sum(pages_needed) + extra_pages
    order = torch.randperm(num_pages, generator=gen)
    max_pages = max(pages_needed + [1]) + 1
    table = torch.randint(0, num_pages, (len(dense), max_pages), generator=gen, dtype=torch.int32)
    cache = torch.full((num_pages, page_size, *row_shape), float("nan"), dtype=torch.float64)
    cursor = 0
    for b, d in enumerate(dense):
        mine = order[cursor : cursor + pages_needed[b]]
        cursor += pages_needed[b]
        table[b, : len(mine)] = mine.to(torch.int32)
        for i in range(d.shape[0]):
            cache[mine[i // page_size], i % page_size] = d[i]
    seq_lens = torch.tensor([d.shape[0] for d in dense], dtype=torch.int32)
    return Paged(cache.to(dtype), table, seq_lens)


def indptr(counts: list[int]) -> torch.Tensor:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return torch.tensor(out, dtype=torch.int32)


@st.composite
def ragged_lengths(draw, max_batch: int = 4, max_len: int = 40) -> list[int]:
    """Per-request KV lengths incl. 0 and 1."""
    n = draw(st.integers(1, max_batch))
    return draw(st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, max_len)), min_size=n, max_size=n))


@st.composite
def extend_lengths(draw, max_batch: int = 4, max_len: int = 40) -> tuple[list[int], list[int]]:
    """(seq_lens, new-token counts) with 0 <= new <= seq_len; a zero seq_len has no new tokens."""
    seq_lens = draw(ragged_lengths(max_batch, max_len))
    new = [draw(st.sampled_from([0, 1, length, draw(st.integers(0, length))])) if length else 0
           for length in seq_lens]
    return seq_lens, new
