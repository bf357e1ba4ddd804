"""Triton paged extend (prefill / chunked prefill) vs the references: ragged new-token counts
over ragged prefixes, permuted NaN-poisoned pages, GQA, fp8 caches, window / softcap / sinks;
16-bit / fp32 caches also with the new tokens' own K/V handed over (read contiguously through
tensor descriptors), as strided views of a fused QKV-like buffer."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import poisoned_like

try:
    from .test_attention_common import make_paged, q_dtypes, ref_extend
except ImportError:
    from test_attention_common import make_paged, q_dtypes, ref_extend


@st.composite
def extend_problem(draw, device):
    small = device == "cpu"
    hq, hkv = draw(tst.gqa_heads(max_kv_heads=2 if small else 4, max_ratio=8 if small else 16))
    lens = draw(tst.seq_lens(max_batch=3 if small else 6, max_len=40 if small else 400))
    new = [draw(st.integers(0, n)) for n in lens]
    return dict(lens=lens, new=new, page_size=draw(tst.page_sizes()), hq=hq, hkv=hkv,
                d=draw(tst.head_dims(small=small)),
                dtype=draw(st.sampled_from(q_dtypes(device))),
                kv_mode=draw(st.sampled_from([None, "per_tensor", "per_head"])),
                causal=draw(st.booleans()),
                window=draw(st.one_of(st.none(), st.integers(1, 30 if small else 300))),
                softcap=draw(st.one_of(st.none(), st.floats(2.0, 30.0))),
                sinks=draw(st.booleans()), new_kv=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31 - 1)))


def new_token_kv(kv, lens, new, extra_cols=0):
    """The new tokens' K and V rows gathered back from the cache ([T, Hkv, D] each), as views
    of one [T, extra + 2 * Hkv * D] buffer, like the K/V parts of a fused QKV projection."""
    ps, hkv, d = kv.k_cache.shape[1:]
    rows = []
    for b, (L, n) in enumerate(zip(lens, new)):
        for pos in range(L - n, L):
            rows.append((int(kv.page_table[b, pos // ps]), pos % ps))
    T = len(rows)
    buf = torch.full((T, extra_cols + 2 * hkv * d), float("nan"), dtype=kv.k_cache.dtype,
                     device=kv.k_cache.device)
    k = buf[:, extra_cols:extra_cols + hkv * d].view(T, hkv, d)
    v = buf[:, extra_cols + hkv * d:].view(T, hkv, d)
    for t, (page, slot) in enumerate(rows):
        k[t] = kv.k_cache[page, slot]
        v[t] = kv.v_cache[page, slot]
    return k, v


def _run_case(c, device):
    gen = torch.Generator().manual_seed(c["seed"])
    kv = make_paged(c["lens"], c["page_size"], c["hkv"], c["d"], c["dtype"], c["kv_mode"],
                    device, gen)
    indptr = torch.tensor([0, *torch.tensor(c["new"], dtype=torch.long).cumsum(0).tolist()],
                          dtype=torch.int32, device=device)
    T = int(indptr[-1])
    q = torch.randn(T, c["hq"], c["d"], generator=gen).to(device, c["dtype"])
    sinks = torch.randn(c["hq"], generator=gen).to(device) * 2 if c["sinks"] else None
    plan = attn.extend_plan(indptr, kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                            k_cache=kv.k_cache, q_dtype=c["dtype"], causal=c["causal"],
                            sliding_window=c["window"], softcap=c["softcap"], sinks=c["sinks"],
                            kv_scale_mode=c["kv_mode"], backend="triton")
    extra = {}
    if c.get("new_kv") and c["kv_mode"] is None:
        k, v = new_token_kv(kv, c["lens"], c["new"], extra_cols=c["hq"] * c["d"])
        extra = dict(k=k, v=v)
    o = plan.run(q, kv.k_cache, kv.v_cache, sinks=sinks, k_scale=kv.k_scale,
                 v_scale=kv.v_scale, out=poisoned_like(q), **extra)
    truth, same = ref_extend(q, kv, indptr, causal=c["causal"], sliding_window=c["window"],
                             softcap=c["softcap"], sinks=sinks, k_scale=kv.k_scale,
                             v_scale=kv.v_scale)
    assert_close(o, truth, baseline=same, name=f"extend {c}")


@pytest.mark.parametrize("shard", tst.shards())
def test_extend_matches_reference(kernel_device, shard):
    tst.run_sharded(lambda data: _run_case(data.draw(extend_problem(kernel_device)),
                                           kernel_device), shard, data=st.data())


@pytest.mark.parametrize("new_kv", [False, True])
def test_extend_prefill_and_chunk(kernel_device, new_kv):
    """A full prefill (no prefix) next to a chunk over a prefix and an idle request."""
    _run_case(dict(lens=[37, 50, 9], new=[37, 13, 0], page_size=8, hq=4, hkv=2, d=32,
                   dtype=torch.float16, kv_mode=None, causal=True, window=None, softcap=None,
                   sinks=False, new_kv=new_kv, seed=5), kernel_device)


def test_extend_new_kv_tiles_across_requests(kernel_device):
    """Contiguous new-token K/V: requests whose new tokens start mid-tile, prefixes that end
    mid-page, a window, several query / key tiles per request (the tile rows that belong to
    the next request, or lie past the tensor, must stay invisible)."""
    lens, new = [70, 41, 66, 5], [33, 41, 20, 5]
    for window in (None, 23):
        _run_case(dict(lens=lens, new=new, page_size=4, hq=4, hkv=2, d=32,
                       dtype=torch.float16, kv_mode=None, causal=True, window=window,
                       softcap=None, sinks=False, new_kv=True, seed=11), kernel_device)


def test_extend_new_kv_bad_input(kernel_device):
    gen = torch.Generator().manual_seed(3)
    kv = make_paged([6, 3], 4, 2, 16, torch.float16, None, kernel_device, gen)
    indptr = torch.tensor([0, 2, 5], dtype=torch.int32, device=kernel_device)
    q = torch.randn(5, 4, 16, generator=gen).to(kernel_device, torch.float16)
    k, v = new_token_kv(kv, [6, 3], [2, 3])
    plan = attn.extend_plan(indptr, kv.page_table, kv.seq_lens, num_q_heads=4,
                            k_cache=kv.k_cache, q_dtype=torch.float16, backend="triton")
    with pytest.raises(ValueError, match="both"):
        plan.run(q, kv.k_cache, kv.v_cache, k=k)
    with pytest.raises(ValueError, match="shape"):
        plan.run(q, kv.k_cache, kv.v_cache, k=k[:4], v=v[:4])
    with pytest.raises(TypeError, match="dtype"):
        plan.run(q, kv.k_cache, kv.v_cache, k=k.float(), v=v.float())
    with pytest.raises(ValueError, match="packed"):
        plan.run(q, kv.k_cache, kv.v_cache, k=k.transpose(0, 1).contiguous().transpose(0, 1),
                 v=v)
    fp8 = make_paged([6, 3], 4, 2, 16, torch.float16, "per_tensor", kernel_device, gen)
    with pytest.raises(ValueError, match="fp8"):
        attn.extend(q, fp8.k_cache, fp8.v_cache, indptr, fp8.page_table, fp8.seq_lens,
                    k_scale=fp8.k_scale, v_scale=fp8.v_scale, k=k, v=v, backend="triton")


def test_public_extend(kernel_device):
    gen = torch.Generator().manual_seed(6)
    kv = make_paged([20, 5], 4, 1, 16, torch.float32, None, kernel_device, gen)
    indptr = torch.tensor([0, 6, 11], dtype=torch.int32, device=kernel_device)
    q = torch.randn(11, 2, 16, generator=gen).to(kernel_device)
    o = attn.extend(q, kv.k_cache, kv.v_cache, indptr, kv.page_table, kv.seq_lens,
                    backend="triton")
    truth, same = ref_extend(q, kv, indptr)
    assert_close(o, truth, baseline=same)
