"""kvcache.store_mla: the reference vs a naive per-token loop, the public op vs the reference,
reference selected on CPU, bad input named."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.kvcache as ref

from ._helpers import assert_reference_selected, assert_same

kvcache = tskernels.kvcache
FP8 = torch.float8_e4m3fn


def naive_store(kv_latent, kv_cache, slot_mapping, kv_scale):
    page_size = kv_cache.shape[1]
    for t in range(kv_latent.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        row = kv_latent[t].float()
        if kv_cache.dtype == FP8:
            row = (row / float(kv_scale)).clamp(-448.0, 448.0)
        kv_cache[slot // page_size, slot % page_size] = row.to(kv_cache.dtype)


@given(t=st.integers(0, 12), num_pages=st.integers(1, 5), page_size=st.sampled_from([1, 3, 16]),
       width=st.sampled_from([1, 7, 576]), seed=st.integers(0, 2**31 - 1),
       dtypes=st.sampled_from([(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                               (torch.bfloat16, FP8), (torch.float32, FP8)]))
def test_store_mla_matches_naive_loop_and_public_matches_reference(
        t, num_pages, page_size, width, seed, dtypes):
    gen = torch.Generator().manual_seed(seed)
    x_dtype, cache_dtype = dtypes
    num_slots = num_pages * page_size
    t = min(t, num_slots)
    kv_latent = (torch.randn(t, width, generator=gen) * 50).to(x_dtype)
    slots = torch.randperm(num_slots, generator=gen)[:t]
    slots[torch.rand(t, generator=gen) < 0.25] = -1  # padding tokens
    kv_scale = torch.tensor([0.05]) if cache_dtype == FP8 else None
    cache0 = torch.randn(num_pages, page_size, width, generator=gen).to(cache_dtype)
    want, got_ref, got = cache0.clone(), cache0.clone(), cache0.clone()
    naive_store(kv_latent, want, slots, kv_scale)
    ref.store_mla(kv_latent, got_ref, slots, kv_scale=kv_scale)
    assert_same(got_ref, want)
    assert kvcache.store_mla(kv_latent, got, slots, kv_scale=kv_scale) is None
    assert_same(got, got_ref)


def test_fp8_write_clamps_to_448():
    cache = torch.zeros(1, 2, 4, dtype=FP8)
    kvcache.store_mla(torch.tensor([[1e6, -1e6, 1.0, 0.0]] * 2), cache,
                      torch.tensor([1, -1]), kv_scale=torch.tensor(2.0))
    assert cache[0, 1].float().tolist() == [448.0, -448.0, 0.5, 0.0]
    assert cache[0, 0].float().abs().sum() == 0


@pytest.mark.parametrize("formats", [{"kv_latent": "bf16", "kv": "bf16"},
                                     {"kv_latent": "bf16", "kv": "fp8_e4m3:per_tensor"}])
def test_reference_selected_on_cpu(formats):
    assert_reference_selected("kvcache", "store_mla", formats=formats,
                              traits={"width": 576, "page_size": 64})


LATENT = torch.randn(3, 8)
CACHE = torch.zeros(2, 4, 8)
SLOTS = torch.tensor([0, 5, -1])


def store(**kw):
    args = dict(kv_latent=LATENT, kv_cache=CACHE.clone(), slot_mapping=SLOTS)
    args.update(kw)
    return lambda: kvcache.store_mla(**args)


BAD = [
    (store(kv_latent=LATENT[0]), ValueError, "kv_latent: expected 2 dim"),
    (store(kv_latent=LATENT.int()), TypeError, "kv_latent: expected dtype"),
    (store(kv_latent=LATENT.t().contiguous().t()), ValueError, "kv_latent: the last dimension"),
    (store(kv_cache=CACHE[..., :7].clone()), ValueError, r"kv_cache: expected shape .*, 8\)"),
    (store(kv_cache=CACHE.int()), TypeError, "kv_cache: expected dtype"),
    (store(kv_cache=CACHE.to("meta")), ValueError, "kv_cache: expected a tensor on"),
    (store(kv_cache=torch.zeros(4, 2, 8).transpose(0, 1)), ValueError,
     "kv_cache: must be contiguous"),
    (store(slot_mapping=SLOTS.int()), TypeError, "slot_mapping: expected dtype int64"),
    (store(slot_mapping=SLOTS[:2]), ValueError, "slot_mapping: expected shape"),
    (store(slot_mapping=torch.tensor([0, 8, -1])), ValueError,
     "slot_mapping: expected slots below num_pages"),
    (store(kv_cache=CACHE.to(FP8)), ValueError, "kv_scale: required when kv_cache is fp8"),
    (store(kv_cache=CACHE.to(FP8), kv_scale=torch.ones(2)), ValueError, "kv_scale: expected one"),
    (store(kv_cache=CACHE.to(FP8), kv_scale=torch.ones(1, 1)), ValueError,
     "kv_scale: expected one"),
    (store(kv_cache=CACHE.to(FP8), kv_scale=torch.ones(1, dtype=torch.float64)), TypeError,
     "kv_scale: expected dtype float32"),
    (store(kv_cache=CACHE.to(FP8), kv_scale=torch.ones(1, device="meta")), ValueError,
     "kv_scale: expected a tensor on"),
]


@pytest.mark.parametrize("call,exc,match", BAD)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
