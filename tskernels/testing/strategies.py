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


# --- sharding one property test over pytest-xdist workers ------------------------------------
# A hypothesis test runs its examples one after another in one process. On the GPU tier most of
# each example's time is the Triton JIT compile of a new specialisation, so a 120-example test
# takes many minutes. `shards()` + `run_sharded` split the examples of one test into N
# independently seeded pytest cases (N from TSKERNELS_TEST_SHARDS, default 1) that xdist spreads
# over the machine's cores. With one shard the active profile applies unchanged (CI: the
# derandomized "ci" profile); with N shards each runs ceil(max_examples / N) examples from its
# own fixed seed, so the run stays reproducible and covers as many examples in total; failing
# examples are reported as drawn, without shrinking.

def shards() -> list[int]:
    import os
    return list(range(max(1, int(os.environ.get("TSKERNELS_TEST_SHARDS", "1")))))


def run_sharded(check, shard: int, **given_kwargs) -> None:
    """Run `check(**drawn)` as a hypothesis test over `given_kwargs`, as shard `shard`."""
    from hypothesis import Phase, given, seed, settings

    n = len(shards())
    test = given(**given_kwargs)(check)
    if n > 1:
        base = settings.default
        per = -(-base.max_examples // n)
        # no shrinking: on a GPU every shrink step may JIT-compile a new specialisation; the
        # failing example is reported as drawn (reproduce it with the shard's seed)
        test = seed(0x75C0 + shard)(settings(base, max_examples=per, derandomize=False,
                                             database=None,
                                             phases=[Phase.explicit, Phase.generate])(test))
    test()
