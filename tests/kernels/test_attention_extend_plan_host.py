"""The extend plan's host side (issue 20): `attention.extend_plan` given the caller's host copies
of qo_indptr / seq_lens builds the same plan as without them and reads nothing back from the
tensors; bad copies fail clearly; and the CUDA paged plan's numpy split choice and work items
equal the Python loops they replaced (kept below as the reference) on drawn batches.
The CUDA plan on the device: tests/kernels/test_attention_cuda_paged_extend.py (GPU tier)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.ops.attention import cuda_extend as ce
from tskernels.ops.shared import extend_split as sp

try:
    from .test_attention_common import make_paged
except ImportError:
    from test_attention_common import make_paged


# ---- the loops the numpy construction replaced (the reference) ------------------------------

def old_blocks_of(counts, prefixes, block_m, block_n, group=1):
    out = []
    for b, (n, pre) in enumerate(zip(counts, prefixes)):
        rows = n * group
        for i in range(-(-rows // block_m)):
            m0 = i * block_m
            last = min(m0 + block_m, rows) - 1
            out.append((b, i, (pre + last // group) // block_n + 1,
                        (pre + m0 // group) // block_n + 1))
    return out


def old_tile_ranges(n_tiles, first_row_tiles, splits):
    s = min(splits, first_row_tiles)
    starts = [min(k * n_tiles // s, first_row_tiles - s + k) for k in range(s)]
    return list(zip(starts, starts[1:] + [n_tiles]))


def old_split_work(counts, prefixes, splits, block_m=128, block_n=128, group=1):
    work = [(b, i, t0, t1, k)
            for b, i, nt, fr in old_blocks_of(counts, prefixes, block_m, block_n, group)
            for k, (t0, t1) in enumerate(old_tile_ranges(nt, fr, splits))]
    work.sort(key=lambda w: -(w[3] - w[2]))
    return work


def old_estimated_us(blocks, heads, splits, num_sms, num_tokens, hq=None):
    lengths: dict[float, int] = {}
    for _, _, nt, fr in blocks:
        for t0, t1 in old_tile_ranges(nt, fr, splits):
            key = t1 - t0 + sp.ITEM_OVERHEAD_TILES
            lengths[key] = lengths.get(key, 0) + heads
    total, pos, nxt = 0.0, 0, 0
    for length in sorted(lengths, reverse=True):
        cnt = lengths[length]
        while nxt < pos + cnt:
            total += length
            nxt += num_sms
        pos += cnt
    us = total * sp.TILE_US
    if splits > 1:
        rows = sp.workspace_bytes(num_tokens, hq or heads, splits)
        us += sp.MERGE_LAUNCH_US + rows * 1.25 / sp.MERGE_BW * 1e6
    return us


def old_choose_splits(counts, prefixes, hq, num_sms, block_m=128, block_n=128, group=1):
    blocks = old_blocks_of(counts, prefixes, block_m, block_n, group)
    T, heads = sum(counts), hq // group
    if not blocks or heads * len(blocks) >= sp.AUTO_MAX_WAVES * num_sms or \
            T > sp.MAX_MERGE_TOKENS:
        return 1
    most = max(fr for *_, fr in blocks)
    base = old_estimated_us(blocks, heads, 1, num_sms, T, hq)
    best, best_us = 1, base
    for s in sp.CANDIDATES[1:]:
        if s > most or sp.workspace_bytes(T, hq, s) > sp.WORKSPACE_CAP:
            break
        us = old_estimated_us(blocks, heads, s, num_sms, T, hq)
        if us < best_us:
            best, best_us = s, us
    return best if best_us < sp.AUTO_GAIN * base else 1


def old_work_list(counts, block_m=128, prefixes=None):
    pre = prefixes or [0] * len(counts)
    work = [(b, i) for b, n in enumerate(counts) for i in range(-(-n // block_m))]
    work.sort(key=lambda bi: -(pre[bi[0]] + min((bi[1] + 1) * block_m, counts[bi[0]])))
    return work


def old_work_items(paged, splits, gqa_pack, counts, prefixes, hq, group, block_n, num_sms):
    if not paged:
        return 1, False, old_work_list(counts, prefixes=prefixes)
    g = group if gqa_pack else 1
    if splits is None:
        splits = old_choose_splits(counts, prefixes, hq, num_sms, 128, block_n, g)
    if splits > 1:
        return splits, gqa_pack, old_split_work(counts, prefixes, splits, 128, block_n, g)
    if gqa_pack:
        return 1, True, [w[:2] for w in old_split_work(counts, prefixes, 1, 128, block_n, g)]
    return 1, False, old_work_list(counts, prefixes=prefixes)


# ---- the numpy construction against it ------------------------------------------------------

class _Platform:
    def __init__(self, num_sms):
        self.num_sms = num_sms


# counts up to a 2,048-token step (and the later turn's 800), prefixes up to 64k
batches = st.lists(st.tuples(st.integers(0, 2100), st.integers(0, 66000)), min_size=1,
                   max_size=6)
heads = st.sampled_from([(32, 8), (32, 4), (8, 8), (8, 1), (64, 8), (28, 4), (16, 2)])


@settings(max_examples=300, deadline=None)
@given(batch=batches, heads=heads, splits=st.sampled_from([None, None, 1, 2, 3, 5, 16, 64]),
       pack=st.booleans(), block_n=st.sampled_from([64, 128]),
       num_sms=st.sampled_from([132, 78, 16]))
def test_work_items_equal_the_loops(batch, heads, splits, pack, block_n, num_sms):
    counts, prefixes = [n for n, _ in batch], [p for _, p in batch]
    hq, hkv = heads
    if splits not in (None, 1) and sum(counts) > sp.MAX_MERGE_TOKENS:
        splits = 1
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ce, "platform_of", lambda device: _Platform(num_sms))
        m.setattr(sp, "ITEM_ORDER", "length")  # the loops' order ("start": tested below)
        s, p, work = ce._work_items(True, splits, pack, counts, prefixes, hq, hq // hkv,
                                    block_n, "cpu")
    want = old_work_items(True, splits, pack, counts, prefixes, hq, hq // hkv, block_n,
                          num_sms)
    assert work.dtype == np.int32 and work.flags.c_contiguous
    assert (s, p, [tuple(w) for w in work.tolist()]) == want
    s, p, work = ce._work_items(False, 1, False, counts, [0] * len(counts), hq, hq // hkv,
                                block_n, "cpu")
    assert [tuple(w) for w in work.tolist()] == old_work_list(counts, prefixes=[0] * len(counts))


@settings(max_examples=200, deadline=None)
@given(batch=batches, group=st.sampled_from([1, 2, 4, 8]), heads=st.integers(1, 64),
       splits=st.integers(1, 64), num_sms=st.sampled_from([132, 78, 16, 1]),
       block_n=st.sampled_from([64, 128]))
def test_estimate_equals_the_loop(batch, group, heads, splits, num_sms, block_n):
    """Bit for bit: the split choice compares these floats."""
    counts, prefixes = [n for n, _ in batch], [p for _, p in batch]
    blocks = old_blocks_of(counts, prefixes, 128, block_n, group)
    assert sp.blocks_of(counts, prefixes, 128, block_n, group) == blocks
    T = sum(counts)
    assert sp.estimated_us(blocks, heads, splits, num_sms, T, 32) == \
        old_estimated_us(blocks, heads, splits, num_sms, T, 32)
    assert sp.choose_splits(counts, prefixes, heads * group, num_sms, 128, block_n, group) == \
        old_choose_splits(counts, prefixes, heads * group, num_sms, 128, block_n, group)


@pytest.mark.parametrize("cached", [50000, 50800, 51000, 52000, 54300])
def test_later_turn_shape(cached):
    """Issue 20's later turn (800 new tokens, Llama-3-8B heads, H200's 132 SMs)."""
    for new in (800, 816, 848, 16, 128):
        assert sp.choose_splits([new], [cached], 32, 132, group=4) == \
            old_choose_splits([new], [cached], 32, 132, group=4)
        s = sp.choose_splits([new], [cached], 32, 132, group=4)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(sp, "ITEM_ORDER", "length")
            assert sp.split_work([new], [cached], s, group=4) == \
                old_split_work([new], [cached], s, group=4)


def test_negative_prefix_is_refused():
    with pytest.raises(ValueError, match="tile_ranges"):
        sp.split_work([10], [-200], 2)


# ---- extend_plan's host copies ----------------------------------------------------------------

def _batch(device="cpu"):
    gen = torch.Generator().manual_seed(7)
    lens, new = [70, 41, 9, 0], [33, 41, 0, 0]
    kv = make_paged(lens, 8, 2, 32, torch.float32, None, device, gen)
    ptr = [0, *np.cumsum(new).tolist()]
    qo = torch.tensor(ptr, dtype=torch.int32, device=device)
    return kv, qo, ptr, lens


class _NoRead:
    """Fails the test on any read of a tensor's values to the host."""

    NAMES = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__index__", "__float__")

    def __init__(self, monkeypatch):
        for name in self.NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._boom(name))

    @staticmethod
    def _boom(name):
        def boom(self, *a, **k):
            raise AssertionError(f"the plan read a tensor to the host ({name})")
        return boom


def _plan(kv, qo, backend, **host):
    return attn.extend_plan(qo, kv.page_table, kv.seq_lens, num_q_heads=4, k_cache=kv.k_cache,
                            q_dtype=torch.float32, backend=backend, **host)


@pytest.mark.parametrize("backend", ["triton", "torch_cpu", "reference"])
@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_host_copies_give_the_same_plan_without_reads(monkeypatch, backend, kind):
    kv, qo, ptr, lens = _batch()
    wrap = {"list": list, "numpy": np.array,
            "tensor": lambda x: torch.tensor(x, dtype=torch.int32)}[kind]
    host = dict(host_qo_indptr=wrap(ptr), host_seq_lens=wrap(lens))
    base = _plan(kv, qo, backend)
    with monkeypatch.context() as m:
        if kind != "tensor":   # (a CPU tensor copy is read by .numpy(), which is no sync)
            _NoRead(m)
        got = _plan(kv, qo, backend, **host)
    assert repr(got) == repr(base)
    if backend == "triton":
        assert torch.equal(got.work, base.work) and got.num_blocks == base.num_blocks
    if backend == "torch_cpu":
        assert [p[:2] + p[4:] for p in got.parts] == [p[:2] + p[4:] for p in base.parts]
    q = torch.randn(int(ptr[-1]), 4, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(got.run(q, kv.k_cache, kv.v_cache),
                               base.run(q, kv.k_cache, kv.v_cache), rtol=0, atol=0)


def test_host_copies_select_like_the_tensors(monkeypatch):
    """The `prefix` trait comes from the host copies: a batch without a cached prefix and one
    with (extend's selection sees the same)."""
    seen = []
    real = attn._select_planned
    monkeypatch.setattr(attn, "_select_planned",
                        lambda *a, **k: seen.append(k["extra"]["prefix"]) or real(*a, **k))
    kv, qo, ptr, lens = _batch()
    for host in ({}, dict(host_qo_indptr=ptr, host_seq_lens=lens)):
        _plan(kv, qo, "reference", **host)
    gen = torch.Generator().manual_seed(2)
    kv2 = make_paged([5, 3], 8, 2, 32, torch.float32, None, "cpu", gen)
    qo2 = torch.tensor([0, 5, 8], dtype=torch.int32)
    for host in ({}, dict(host_qo_indptr=[0, 5, 8], host_seq_lens=[5, 3])):
        _plan(kv2, qo2, "reference", **host)
    assert seen == [True, True, False, False]


def bad_host_copies(ptr: list, lens: list) -> list:
    """(extend_plan keywords, error, message) for host copies of a 4-request batch that every
    extend plan refuses (ops/shared/host_lengths.host_copies; the MLA tests take them too)."""
    return [
        (dict(host_qo_indptr=ptr), ValueError, "both"),
        (dict(host_seq_lens=lens), ValueError, "both"),
        (dict(host_qo_indptr=ptr[:-1], host_seq_lens=lens), ValueError,
         r"host_qo_indptr: expected 5 values \(batch 4\)"),
        (dict(host_qo_indptr=ptr, host_seq_lens=lens + [3]), ValueError,
         r"host_seq_lens: expected 4 values"),
        (dict(host_qo_indptr=np.array([ptr]), host_seq_lens=lens), ValueError,
         "host_qo_indptr: expected 5 values"),
        (dict(host_qo_indptr=[float(x) for x in ptr], host_seq_lens=lens), TypeError,
         "host_qo_indptr: expected integers")]


def test_bad_host_copies():
    kv, qo, ptr, lens = _batch()
    for host, err, match in bad_host_copies(ptr, lens):
        with pytest.raises(err, match=match):
            _plan(kv, qo, "reference", **host)


@pytest.mark.gpu
def test_cuda_paged_plan_with_host_copies():
    """The CUDA paged plan (sm_90) from host copies: the same split count and work items as
    from the device tensors."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    gen = torch.Generator().manual_seed(3)
    lens, new = [51000, 900, 300], [800, 16, 300]
    kv = make_paged(lens, 64, 8, 128, torch.bfloat16, None, "cuda", gen)
    ptr = [0, *np.cumsum(new).tolist()]
    qo = torch.tensor(ptr, dtype=torch.int32, device="cuda")
    mk = lambda **h: attn.extend_plan(qo, kv.page_table, kv.seq_lens, num_q_heads=32,  # noqa: E731
                                      k_cache=kv.k_cache, backend="cuda_paged", **h)
    base, got = mk(), mk(host_qo_indptr=ptr, host_seq_lens=lens)
    assert (got.splits, got.gqa_pack, got.num_blocks) == (base.splits, base.gqa_pack,
                                                          base.num_blocks)
    assert torch.equal(got.work, base.work)
    q = torch.randn(sum(new), 32, 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(got.run(q, kv.k_cache, kv.v_cache), base.run(q, kv.k_cache, kv.v_cache))


# ---- the launch order (extend_split.ITEM_ORDER) ---------------------------------------------

@settings(max_examples=200, deadline=None)
@given(batch=batches, splits=st.sampled_from([1, 2, 3, 5, 16, 64]),
       group=st.sampled_from([1, 4, 8]), block_n=st.sampled_from([64, 128]))
def test_start_order_is_the_same_items_by_first_tile(batch, splits, group, block_n):
    """"start" launches the same items as "length", ordered by first key tile, then longest
    first, then request and query block."""
    counts, prefixes = [n for n, _ in batch], [p for _, p in batch]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sp, "ITEM_ORDER", "length")
        by_length = sp.split_table(counts, prefixes, splits, 128, block_n, group)
        m.setattr(sp, "ITEM_ORDER", "start")
        by_start = sp.split_table(counts, prefixes, splits, 128, block_n, group)
    assert by_start.dtype == np.int32 and by_start.flags.c_contiguous
    assert sorted(map(tuple, by_start.tolist())) == sorted(map(tuple, by_length.tolist()))
    keys = [(t0, t0 - t1, b, i) for b, i, t0, t1, _ in by_start.tolist()]
    assert keys == sorted(keys)


def test_later_turn_launches_by_first_tile():
    """The default: the later turn's plan launches every block's first part, then every
    block's second part, ... (CTAs running together read the same key tiles)."""
    assert sp.ITEM_ORDER == "start"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ce, "platform_of", lambda device: _Platform(132))
        s, _, work = ce._work_items(True, None, True, [800], [50800], 32, 4, 128, "cpu")
    assert s > 1 and len(work) == 25 * s
    assert work[:, 4].tolist() == sorted(work[:, 4].tolist())   # split index by split index
    assert (np.diff(work[:, 2]) >= 0).all()
