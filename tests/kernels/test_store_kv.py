"""store_kv kernel vs the reference: bf16/fp16 pages, fp8 quantize-on-write, skipped slots."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.attention as ref


@st.composite
def store_problems(draw):
    return dict(T=draw(st.integers(0, 12)), hkv=draw(st.integers(1, 5)),
                d=draw(st.sampled_from([16, 64, 80, 128])),
                page=draw(st.sampled_from([1, 4, 16])), pages=draw(st.integers(4, 10)),
                cache=draw(st.sampled_from(["same", "fp8_tensor", "fp8_head"])),
                dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])))


@given(seed=st.integers(0, 2**31 - 1), p=store_problems())
def test_store_kv_triton(kernel_device, seed, p):
    torch.manual_seed(seed)
    T, H, D = p["T"], p["hkv"], p["d"]
    T = min(T, p["pages"] * p["page"])
    k = torch.randn(T, H, D).to(kernel_device, p["dtype"])
    v = torch.randn(T, H, D).to(kernel_device, p["dtype"])
    slots = torch.randperm(p["pages"] * p["page"])[:T].to(kernel_device)
    if T > 2:
        slots[1] = -1  # padding token: must be skipped
    cache_dtype = torch.float8_e4m3fn if p["cache"] != "same" else p["dtype"]
    shape = (p["pages"], p["page"], H, D)
    kc = torch.full(shape, float("nan")).to(kernel_device, cache_dtype)
    vc = kc.clone()
    ks = vs = None
    if p["cache"] != "same":
        n = H if p["cache"] == "fp8_head" else 1
        ks = (torch.rand(n) * 0.02 + 0.001).to(kernel_device)
        vs = (torch.rand(n) * 0.02 + 0.001).to(kernel_device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref.store_kv(k, v, kc_ref, vc_ref, slots, k_scale=ks, v_scale=vs)
    tskernels.attention.store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs, backend="triton")
    for got, want in ((kc, kc_ref), (vc, vc_ref)):
        if got.element_size() == 1:
            _assert_fp8_codes_match(got, want)
        else:  # bit-exact, NaN (untouched slots) included
            assert torch.equal(got.float().nan_to_num(7.5), want.float().nan_to_num(7.5))


def _assert_fp8_codes_match(got, want):
    """fp8 codes equal, except a rounding tie may land on the neighbouring code (the interpreter
    converts through fp16; hardware converts fp32 -> e4m3 directly). NaN slots match exactly."""
    a, b = got.view(torch.uint8).cpu().int(), want.view(torch.uint8).cpu().int()
    nan_a, nan_b = (a & 0x7F) == 0x7F, (b & 0x7F) == 0x7F
    assert torch.equal(nan_a, nan_b), "written/unwritten slots differ"
    diff = (a - b).abs()
    assert int(diff.max()) <= 1 if diff.numel() else True, f"fp8 codes differ by {int(diff.max())}"
    assert int((diff == 1).sum()) <= max(1, a.numel() // 100), "too many off-by-one-code values"


def test_store_kv_strided_input(kernel_device):
    qkv = torch.randn(5, 3, 2, 32, device=kernel_device)  # [T, q/k/v, H, D] -> strided k, v
    k, v = qkv[:, 1], qkv[:, 2]
    kc = torch.zeros(4, 4, 2, 32, device=kernel_device)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([3, 0, 9, 15, 4], device=kernel_device)
    tskernels.attention.store_kv(k, v, kc, vc, slots, backend="triton")
    torch.testing.assert_close(kc.view(-1, 2, 32)[slots], k, rtol=0, atol=0)
    torch.testing.assert_close(vc.view(-1, 2, 32)[slots], v, rtol=0, atol=0)


def test_store_kv_rejects_bad_input():
    k = torch.randn(2, 2, 16)
    kc = torch.zeros(2, 4, 2, 16)
    with pytest.raises(TypeError, match="slot_mapping"):
        tskernels.attention.store_kv(k, k, kc, kc.clone(), torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="k_scale"):
        f8 = kc.to(torch.float8_e4m3fn)
        tskernels.attention.store_kv(k, k, f8, f8.clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="KV heads"):
        tskernels.attention.store_kv(torch.randn(2, 3, 16), torch.randn(2, 3, 16), kc, kc.clone(),
                                     torch.tensor([0, 1]))


@pytest.mark.parametrize("cache", ["same", "fp8_head"])
def test_chained_store_kv(kernel_device, monkeypatch, cache):
    """The chained wrapper (shared/pdl.CHAIN "store_kv") writes what the reference writes,
    skipped slots (-1) included: its wait comes before the skip."""
    from tskernels.ops.shared import pdl
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"store_kv"}))
    T, H, D = 5, 2, 64
    k = torch.randn(T, H, D).to(kernel_device, torch.float16)
    v = torch.randn(T, H, D).to(kernel_device, torch.float16)
    slots = torch.tensor([9, -1, 0, 31, 4], device=kernel_device)
    cdt = torch.float8_e4m3fn if cache != "same" else torch.float16
    kc = torch.full((4, 8, H, D), float("nan")).to(kernel_device, cdt)
    vc = kc.clone()
    ks = vs = None
    if cache != "same":
        ks = (torch.rand(H) * 0.02 + 0.001).to(kernel_device)
        vs = (torch.rand(H) * 0.02 + 0.001).to(kernel_device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref.store_kv(k, v, kc_ref, vc_ref, slots, k_scale=ks, v_scale=vs)
    tskernels.attention.store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs, backend="triton")
    for got, want in ((kc, kc_ref), (vc, vc_ref)):
        if got.element_size() == 1:
            _assert_fp8_codes_match(got, want)
        else:
            assert torch.equal(got.float().nan_to_num(7.5), want.float().nan_to_num(7.5))
