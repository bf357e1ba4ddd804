"""Triton paged decode vs the references: ragged lengths (0, 1, not a page multiple), permuted
page tables, NaN-poisoned unused slots, GQA 1-16, fp8 caches, window / softcap / sinks, splits,
both kernel forms (query heads or keys on the tensor-core M side). fp8 caches are held to q's
dtype tolerance against the exactly dequantized cache: the fp8 form's q split (hi + lo e4m3)
must be as accurate as a 16-bit q (one e4m3 term would be ~4 % off)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import poisoned_like

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import make_paged, q_dtypes, ref_decode
except ImportError:
    from test_attention_common import make_paged, q_dtypes, ref_decode


@st.composite
def decode_problem(draw, device):
    small = device == "cpu"
    hq, hkv = draw(tst.gqa_heads(max_kv_heads=2 if small else 4))
    return dict(
        lens=draw(tst.seq_lens(max_batch=3 if small else 8, max_len=80 if small else 3000)),
        page_size=draw(tst.page_sizes()), hq=hq, hkv=hkv,
        d=draw(tst.head_dims(small=small)), dtype=draw(st.sampled_from(q_dtypes(device))),
        kv_mode=draw(st.sampled_from([None, "per_tensor", "per_head"])),
        window=draw(st.one_of(st.none(), st.integers(1, 40 if small else 1500))),
        softcap=draw(st.one_of(st.none(), st.floats(2.0, 30.0))),
        sinks=draw(st.booleans()),
        num_splits=draw(st.one_of(st.none(), st.integers(1, 6))),
        # kernel form: None = the plan's choice (keys on the M side for fp8 caches, q split
        # into two e4m3 terms; query heads on M for 16-bit caches), or forced either way
        keys_m=draw(st.sampled_from([None, True, False])),
        seed=draw(st.integers(0, 2**31 - 1)))


def _run_case(c, device):
    gen = torch.Generator().manual_seed(c["seed"])
    kv = make_paged(c["lens"], c["page_size"], c["hkv"], c["d"], c["dtype"], c["kv_mode"],
                    device, gen)
    q = torch.randn(len(c["lens"]), c["hq"], c["d"], generator=gen).to(device, c["dtype"])
    sinks = torch.randn(c["hq"], generator=gen).to(device) * 2 if c["sinks"] else None
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                            k_cache=kv.k_cache, q_dtype=c["dtype"],
                            sliding_window=c["window"], softcap=c["softcap"],
                            sinks=c["sinks"], kv_scale_mode=c["kv_mode"],
                            num_splits=c["num_splits"], backend="triton")
    if c.get("keys_m") is not None:
        plan.keys_m = c["keys_m"]
    out = poisoned_like(q)
    o = plan.run(q, kv.k_cache, kv.v_cache, sinks=sinks, k_scale=kv.k_scale,
                 v_scale=kv.v_scale, out=out)
    assert o is out
    truth, same = ref_decode(q, kv, sliding_window=c["window"], softcap=c["softcap"],
                             sinks=sinks, k_scale=kv.k_scale, v_scale=kv.v_scale)
    assert_close(o, truth, baseline=same, name=f"decode {c}")


@pytest.mark.parametrize("shard", tst.shards())
def test_decode_matches_reference(kernel_device, shard):
    tst.run_sharded(lambda data: _run_case(data.draw(decode_problem(kernel_device)),
                                           kernel_device), shard, data=st.data())


@pytest.mark.parametrize("page_size,d,group", [(16, 64, 4), (1, 32, 1), (256, 16, 16)])
def test_decode_edges(kernel_device, page_size, d, group):
    """Fixed corner cases: every request empty but one, a single key, a full last page."""
    for lens in ([0, 0, 1], [page_size, 2 * page_size - 1, 0]):
        _run_case(dict(lens=lens, page_size=page_size, hq=2 * group, hkv=2, d=d,
                       dtype=torch.float16, kv_mode=None, window=None, softcap=None,
                       sinks=True, num_splits=3, seed=1), kernel_device)


def test_public_decode_uses_plan_path(kernel_device):
    """attention.decode (plans internally) equals an explicit plan's run."""
    gen = torch.Generator().manual_seed(3)
    kv = make_paged([7, 50], 8, 2, 32, torch.float16, None, kernel_device, gen)
    q = torch.randn(2, 8, 32, generator=gen).to(kernel_device, torch.float16)
    o1 = attn.decode(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, backend="triton")
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=8, k_cache=kv.k_cache,
                            q_dtype=q.dtype, backend="triton")
    torch.testing.assert_close(o1, plan.run(q, kv.k_cache, kv.v_cache), rtol=0, atol=0)


def test_plan_reused_after_in_place_update(kernel_device):
    """A plan holds page_table/seq_lens by reference: in-place growth is seen by run."""
    gen = torch.Generator().manual_seed(4)
    kv = make_paged([30, 61], 16, 1, 32, torch.float16, None, kernel_device, gen)
    q = torch.randn(2, 4, 32, generator=gen).to(kernel_device, torch.float16)
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=4, k_cache=kv.k_cache,
                            q_dtype=q.dtype, max_seq_len=64, num_splits=2, backend="triton")
    plan.run(q, kv.k_cache, kv.v_cache)
    kv.seq_lens.sub_(torch.tensor([29, 3], dtype=torch.int32, device=kernel_device))
    truth, same = ref_decode(q, kv)
    assert_close(plan.run(q, kv.k_cache, kv.v_cache), truth, baseline=same)


@pytest.mark.parametrize("fused", [True, False])
def test_split_merge_runs_again(kernel_device, fused):
    """Split-KV merged by the last split program (fused, a semaphore per request and KV head,
    re-armed by that program) or by a separate merge launch: three runs of one plan with new
    queries and sinks each match the reference (a stale count would skip or repeat a merge)."""
    gen = torch.Generator().manual_seed(8)
    kv = make_paged([45, 0, 130, 9], 8, 2, 32, torch.float16, None, kernel_device, gen)
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=8, k_cache=kv.k_cache,
                            q_dtype=torch.float16, num_splits=5, sinks=True, backend="triton")
    plan.fused_merge = fused
    for _ in range(3):
        q = torch.randn(4, 8, 32, generator=gen).to(kernel_device, torch.float16)
        sinks = torch.randn(8, generator=gen).to(kernel_device)
        o = plan.run(q, kv.k_cache, kv.v_cache, sinks=sinks, out=poisoned_like(q))
        truth, same = ref_decode(q, kv, sinks=sinks)
        assert_close(o, truth, baseline=same)
    if fused:
        assert int(plan.semaphore.abs().sum()) == 0  # every count re-armed


def test_plan_validation():
    kc = torch.zeros(2, 4, 2, 16)
    pt, sl = torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="KV heads"):
        attn.decode_plan(pt, sl, num_q_heads=3, k_cache=kc)
    with pytest.raises(ValueError, match="kv_scale_mode"):
        attn.decode_plan(pt, sl, num_q_heads=4, k_cache=kc, kv_scale_mode="per_head")


def test_plan_form_choice():
    """fp8 caches take the keys-on-M form (q split into e4m3 terms) unless the head dim is
    below the e4m3 dot's K = 32; 16-bit caches keep the query heads on M."""
    pt, sl = torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    for d, kv_dtype, mode, keys_m in ((64, torch.float8_e4m3fn, "per_tensor", True),
                                      (16, torch.float8_e4m3fn, "per_tensor", False),
                                      (64, torch.float16, None, False)):
        kc = torch.zeros(4, 16, 2, d).to(kv_dtype)
        plan = attn.decode_plan(pt, sl, num_q_heads=8, k_cache=kc, q_dtype=torch.float16,
                                kv_scale_mode=mode, backend="triton")
        assert plan.keys_m is keys_m, (d, kv_dtype)


def test_cache_with_strided_head_dim_is_rejected():
    """The kernels read a cache row's head_dim contiguously: a V cache laid out otherwise
    (e.g. slots innermost) is refused with a clear error, not read wrongly."""
    gen = torch.Generator().manual_seed(9)
    kv = make_paged([20, 5], 16, 2, 32, torch.float16, None, "cpu", gen)
    q = torch.randn(2, 4, 32, generator=gen).to(torch.float16)
    v_slots_inner = kv.v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert torch.equal(v_slots_inner.nan_to_num(), kv.v_cache.nan_to_num())
    with pytest.raises(ValueError, match="v_cache"):
        attn.decode(q, kv.k_cache, v_slots_inner, kv.page_table, kv.seq_lens)


@pytest.mark.parametrize("batch,length,want,want_long", [
    (1, 51712, 33, 64), (1, 200000, 33, 64), (1, 16384, 33, 33), (1, 4096, 32, 32),
    (2, 51712, 17, 17), (16, 32768, 3, 3), (64, 4096, 1, 1)])
def test_split_rule_takes_more_splits_over_long_contexts(batch, length, want, want_long):
    """~2 programs per SM; with long_chunk up to ~4 while each split keeps >= 768 keys (8 KV
    heads, 132 SMs, 64-key blocks)."""
    from tskernels.ops.shared.split_kv import choose_splits
    assert choose_splits(batch, 8, length, 132, 64) == want
    assert choose_splits(batch, 8, length, 132, 64, long_chunk=768) == want_long


def test_many_splits_merge(kernel_device):
    """64 splits of a short request (most of them empty): the separate merge then reads a
    [64 x 128] tile per head with four warps (merge_warps), sinks included."""
    gen = torch.Generator().manual_seed(9)
    kv = make_paged([700, 3, 0], 16, 2, 128, torch.float16, None, kernel_device, gen)
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=4, k_cache=kv.k_cache,
                            q_dtype=torch.float16, num_splits=64, sinks=True, backend="triton")
    assert plan.num_splits == 64 and not plan.fused_merge
    q = torch.randn(3, 4, 128, generator=gen).to(kernel_device, torch.float16)
    sinks = torch.randn(4, generator=gen).to(kernel_device)
    o = plan.run(q, kv.k_cache, kv.v_cache, sinks=sinks, out=poisoned_like(q))
    truth, same = ref_decode(q, kv, sinks=sinks)
    assert_close(o, truth, baseline=same)
