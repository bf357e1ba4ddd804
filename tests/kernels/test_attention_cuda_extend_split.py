"""Split-KV planning of the CUDA paged extend (tskernels/ops/shared/extend_split.py) on
the CPU: the tile ranges each split walks (contiguous, covering, every split starting where
its block's first row sees a key, the masked tiles in the last split), the work list, the
modelled split choice on issue 20's shapes, the argument checks, and the merge of the
workspace rows (ops/shared/split_kv.py's kernel, under the Triton interpreter) against float64.
The kernel itself: tests/kernels/test_attention_cuda_paged_extend.py (GPU tier)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tskernels.numerics import assert_close
from tskernels.ops.shared import extend_split as sp


def _rows(work):
    """A plan's work items (an int32 array, one item per row) as tuples."""
    return [tuple(w) for w in work.tolist()]


def test_tile_ranges_values():
    assert sp.tile_ranges(10, 10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert sp.tile_ranges(403, 401, 4) == [(0, 100), (100, 201), (201, 302), (302, 403)]
    assert sp.tile_ranges(5, 2, 8) == [(0, 1), (1, 5)]   # capped: the last starts at tile 1
    assert sp.tile_ranges(7, 7, 1) == [(0, 7)]
    assert sp.tile_ranges(3, 3, 64) == [(0, 1), (1, 2), (2, 3)]
    for bad in ((0, 1, 1), (4, 5, 2), (4, 0, 2), (4, 4, 0)):
        with pytest.raises(ValueError, match="tile_ranges"):
            sp.tile_ranges(*bad)


@given(n=st.integers(1, 300), pre=st.integers(0, 20000), splits=st.integers(1, 80),
       group=st.sampled_from([1, 3, 4, 16]), bn=st.sampled_from([64, 128]))
def test_split_work_covers_each_block_and_every_row_sees_a_key(n, pre, splits, group, bn):
    """group > 1: GQA-packed rows (token, head-in-group), row r at position pre + r // group."""
    bm = 128
    work = sp.split_work([n], [pre], splits, bm, bn, group)
    # launch order (sp.ITEM_ORDER "start"): by first tile, then longest first, then block
    keys = [(t0, t0 - t1, b, j) for b, j, t0, t1, _ in work]
    assert keys == sorted(keys)
    assert {j for _, j, *_ in work} == set(range(-(-n * group // bm)))
    for i in range(-(-n * group // bm)):
        mine = sorted((t0, t1, k) for b, j, t0, t1, k in work if j == i)
        m0, last = i * bm, min(i * bm + bm, n * group) - 1
        n_tiles = (pre + last // group) // bn + 1
        first = (pre + m0 // group) // bn + 1
        m0 //= group  # the first row's token
        assert [k for *_, k in mine] == list(range(min(splits, first)))
        assert mine[0][0] == 0 and mine[-1][1] == n_tiles
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))  # contiguous
        for t0, t1, _ in mine:
            assert t1 > t0 and t0 * bn <= pre + m0  # the block's first row sees key t0 * bn
        # every tile the causal mask cuts (past the first row's position) is in the last split
        assert mine[-1][0] <= (pre + m0) // bn


def test_split_work_batch():
    work = sp.split_work([300, 20, 1], [0, 130, 5000], 2)
    assert sorted(work) == sorted([
        (0, 0, 0, 1, 0), (0, 1, 0, 1, 0), (0, 1, 1, 2, 1), (0, 2, 0, 1, 0), (0, 2, 1, 3, 1),
        (1, 0, 0, 1, 0), (1, 0, 1, 2, 1), (2, 0, 0, 20, 0), (2, 0, 20, 40, 1)])
    assert work[0][3] - work[0][2] == 20


def test_blocks_of_packed():
    """GQA packing by 4: 50 tokens are 200 rows, two blocks (tokens 0-31, 32-49)."""
    assert sp.blocks_of([50], [1000], 128, 128, 4) == [(0, 0, 9, 8), (0, 1, 9, 9)]
    assert sp.blocks_of([50], [100], 128, 64, 4) == [(0, 0, 3, 2), (0, 1, 3, 3)]
    assert sp.blocks_of([2, 0], [5, 9], 128, 128, 16) == [(0, 0, 1, 1)]


def test_estimated_time_counts_waves():
    blocks = [(0, 0, 100, 100)]
    one = sp.estimated_us(blocks, 132, 1, 132, 128)      # 132 items: one wave
    two = sp.estimated_us(blocks, 133, 1, 132, 128)      # one more: a second wave
    assert one == pytest.approx((100 + sp.ITEM_OVERHEAD_TILES) * sp.TILE_US)
    assert two == pytest.approx(2 * one)
    merged = sp.estimated_us(blocks, 66, 2, 132, 128)    # 132 items of 50 tiles + the merge
    ws = sp.workspace_bytes(128, 66, 2)
    assert merged == pytest.approx((50 + sp.ITEM_OVERHEAD_TILES) * sp.TILE_US +
                                   sp.MERGE_LAUNCH_US + ws * 1.25 / sp.MERGE_BW * 1e6)


def test_choose_splits_on_issue_20_shapes():
    """Llama-3-8B (32 query heads) on 132 SMs: the later turn (800 over 50.8k) and short
    follow-ups (16 / 128 over 51k) split; a 4k / 2k prefill and a long batch stay unsplit."""
    choose = lambda n, pre, g=1: sp.choose_splits(n, pre, 32, 132, group=g)  # noqa: E731
    # GQA-packed (8 CTAs per block of 32 tokens x 4 heads): more splits for the short ones
    assert choose([800], [50800], 4) == 5 and choose([16], [51000], 4) == 16
    assert choose([128], [51000], 4) == 4 and choose([4096], [0], 4) == 1
    assert choose([800], [50800]) == 4
    assert choose([16], [51000]) == 4
    assert choose([128], [51000]) == 4
    assert choose([4096], [0]) == 1 and choose([2048], [0]) == 1
    assert choose([8192], [40000]) == 1                 # 64 blocks x 32 heads: 15.5 waves
    assert choose([16], [200]) == 1                     # 2 tiles: nothing to gain
    assert choose([], []) == 1


def test_resolve_splits_checks():
    assert sp.resolve_splits(7, [10], [0], 8, 132) == 7
    assert sp.resolve_splits(None, [16], [51000], 32, 132) == 4
    for bad in (0, 65, 2.0, True, "4"):
        with pytest.raises(ValueError, match="splits must be"):
            sp.resolve_splits(bad, [10], [0], 8, 132)
    with pytest.raises(ValueError, match="at most 65535 new tokens"):
        sp.resolve_splits(2, [70000], [0], 8, 132)


def test_merge_against_float64():
    """Rows of a token's splits merged into a strided fp16 out; unused split rows keep the
    workspace's (o = 0, lse = -inf) and weigh nothing."""
    gen = torch.Generator().manual_seed(4)
    T, hq, S = 5, 3, 3
    po, plse = sp.workspace(T, hq, S, "cpu")
    used = torch.randint(1, S + 1, (T,), generator=gen)  # splits each token's block got
    for t in range(T):
        for h in range(hq):
            r = (t * hq + h) * S
            po[r:r + used[t]] = torch.randn(int(used[t]), 128, generator=gen)
            plse[r:r + used[t]] = 4 * torch.randn(int(used[t]), generator=gen)
    out = torch.full((T, hq + 2, 128), float("nan"), dtype=torch.float16)[:, 1:hq + 1]
    sp.merge(po, plse, out, S)
    o64, l64 = po.double().view(T, hq, S, 128), plse.double().view(T, hq, S)
    w = torch.softmax(l64, dim=-1)
    truth = (w[..., None] * o64).sum(2)
    assert_close(out, truth, name="split merge")


def test_plan_work_items_and_option_checks():
    """The CUDA plan's host-side choice (cuda_extend._work_items, no device needed for forced
    split counts): unsplit / split / GQA-packed work lists, and the options' clear errors."""
    from tskernels.ops.attention.cuda_extend import _work_items, work_list
    counts, pre = [300, 20], [0, 5000]
    s, pack, work = _work_items(True, 1, False, counts, pre, 8, 4, 128, "cpu")
    assert (s, pack, _rows(work)) == (1, False, work_list(counts, prefixes=pre))
    s, pack, work = _work_items(True, 3, False, counts, pre, 8, 4, 128, "cpu")
    assert (s, pack) == (3, False) and _rows(work) == sp.split_work(counts, pre, 3)
    s, pack, work = _work_items(True, 1, True, counts, pre, 8, 4, 128, "cpu")
    assert (s, pack) == (1, True)   # 1200 packed rows (10 blocks) + 80 (1 block)
    work = _rows(work)
    assert sorted(work) == [(0, i) for i in range(10)] + [(1, 0)] and work[0] == (1, 0)
    s, pack, work = _work_items(True, 2, True, counts, pre, 8, 4, 128, "cpu")
    assert _rows(work) == sp.split_work(counts, pre, 2, group=4)
    with pytest.raises(ValueError, match="gqa_pack must be a bool"):
        _work_items(True, 1, 1, counts, pre, 8, 4, 128, "cpu")
    for bad in (dict(splits=2, gqa_pack=False), dict(splits=1, gqa_pack=True),
                dict(splits=True, gqa_pack=False)):
        with pytest.raises(ValueError, match="need the paged plan"):
            _work_items(False, bad["splits"], bad["gqa_pack"], counts, [0, 0], 8, 4, 128,
                        "cpu")
    assert _work_items(False, None, False, [5], [0], 8, 4, 128, "cpu")[:2] == (1, False)
    with pytest.raises(ValueError, match="splits must be"):
        _work_items(True, 0, False, counts, pre, 8, 4, 128, "cpu")


def test_defaults_reach_paged_plans_only(monkeypatch):
    """With the split / packing defaults switched on, a contiguous (non-paged) plan, e.g. a
    first-turn prefill with no prefix, still takes its only build (1 split, unpacked) when the
    options are "default", while a paged plan gets the defaults; options named explicitly are
    kept (and a non-paged plan rejects them clearly)."""
    from tskernels.ops.attention import cuda_extend as ce
    monkeypatch.setattr(ce, "DEFAULT_SPLITS", None)
    monkeypatch.setattr(ce, "DEFAULT_GQA_PACK", True)
    assert ce.resolve_defaults(False, "default", "default") == (1, False)
    assert ce.resolve_defaults(True, "default", "default") == (None, True)
    assert ce.resolve_defaults(True, 3, False) == (3, False)
    assert ce.resolve_defaults(False, 2, "default") == (2, False)
    counts, pre = [300, 20], [0, 0]
    s, pack, work = ce._work_items(False, *ce.resolve_defaults(False, "default", "default"),
                                   counts, pre, 32, 4, 128, "cpu")
    assert (s, pack, _rows(work)) == (1, False, ce.work_list(counts))
    with pytest.raises(ValueError, match="need the paged plan"):
        ce._work_items(False, *ce.resolve_defaults(False, "default", True), counts, pre, 32,
                       4, 128, "cpu")
    monkeypatch.setattr(ce, "DEFAULT_SPLITS", 2)  # a forced default: no device query
    s, pack, work = ce._work_items(True, *ce.resolve_defaults(True, "default", "default"),
                                   counts, [0, 5000], 32, 4, 128, "cpu")
    assert (s, pack) == (2, True) and _rows(work) == sp.split_work(counts, [0, 5000], 2,
                                                                   group=4)
