"""kvcache.store_mla Triton kernel vs the reference: 16-bit / fp32 caches written bit-exactly,
fp8 quantize-on-write, padding slots skipped, untouched slots (NaN) left alone, strided rows."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.kvcache as ref

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_store_kv import _assert_fp8_codes_match
except ImportError:
    from test_store_kv import _assert_fp8_codes_match

FP8 = torch.float8_e4m3fn


@given(seed=st.integers(0, 2**31 - 1), T=st.integers(0, 12), pages=st.integers(2, 6),
       page=st.sampled_from([1, 4, 64]), width=st.sampled_from([8, 100, 576]),
       dtypes=st.sampled_from([(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                               (torch.float16, torch.float16), (torch.float32, torch.float32),
                               (torch.bfloat16, FP8), (torch.float32, FP8)]),
       strided=st.booleans())
def test_store_mla_triton(kernel_device, seed, T, pages, page, width, dtypes, strided):
    gen = torch.Generator().manual_seed(seed)
    x_dtype, cache_dtype = dtypes
    T = min(T, pages * page)
    x = (torch.randn(T, width + (3 if strided else 0), generator=gen) * 20).to(x_dtype)
    x = x.to(kernel_device)[:, :width]
    slots = torch.randperm(pages * page, generator=gen)[:T]
    slots[torch.rand(T, generator=gen) < 0.25] = -1  # padding tokens: skipped
    slots = slots.to(kernel_device)
    scale = torch.tensor([0.05], device=kernel_device) if cache_dtype == FP8 else None
    cache = torch.full((pages, page, width), float("nan")).to(kernel_device, cache_dtype)
    want = cache.clone()
    ref.store_mla(x, want, slots, kv_scale=scale)
    tskernels.kvcache.store_mla(x, cache, slots, kv_scale=scale, backend="triton")
    if cache_dtype == FP8:
        _assert_fp8_codes_match(cache, want)
    elif kernel_device == "cpu" and cache.element_size() < x.element_size():
        # the interpreter truncates a narrowing cast (the GPU rounds to nearest even, as torch):
        # codes within one, NaN (untouched slots) exactly where the reference has them
        a, b = cache.view(torch.int16).int(), want.view(torch.int16).int()
        assert torch.equal(cache.isnan(), want.isnan())
        assert int((a - b).abs().max()) <= 1 if a.numel() else True
    else:  # bit-exact, NaN (untouched slots) included
        assert torch.equal(cache.float().nan_to_num(7.5), want.float().nan_to_num(7.5))
