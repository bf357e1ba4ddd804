"""Hypothesis strategies over valid problems (bounded by the active hypothesis profile)."""
from __future__ import annotations

from hypothesis import strategies as st

HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@st.composite
def gqa_heads(draw, max_kv_heads: int = 4, max_ratio: int = 16):
    """(num_q_heads, num_kv_heads) with a GQA ratio in 1..max_ratio, odd counts included."""
    hkv = draw(st.integers(1, max_kv_heads))
    ratio = draw(st.sampled_from([r for r in (1, 2, 3, 4, 5, 8, 16) if r <= max_ratio]))
    return hkv * ratio, hkv


@st.composite
def seq_lens(draw, max_batch: int = 4, max_len: int = 80, min_batch: int = 1):
    """Ragged lengths including 0 and 1 and lengths that are no multiple of a page."""
    n = draw(st.integers(min_batch, max_batch))
    return draw(st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, max_len)),
                         min_size=n, max_size=n))


def page_sizes(max_page: int = 256):
    return st.sampled_from([p for p in PAGE_SIZES if p <= max_page])


def head_dims(small: bool = True):
    """Head dims; `small` adds 16/32 so interpreter runs stay quick."""
    return st.sampled_from((16, 32, 64) if small else HEAD_DIMS)


def row_shapes(max_rows: int = 64, max_cols: int = 512):
    """(rows, cols) for row-wise ops: 0 and 1 rows, non-power-of-two widths."""
    return st.tuples(st.one_of(st.just(0), st.just(1), st.integers(1, max_rows)),
                     st.one_of(st.just(1), st.integers(1, max_cols)))
