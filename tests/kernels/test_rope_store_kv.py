"""rope_store_kv (q/k RMSNorm + RoPE + paged K/V write in one launch) vs the separate ops: the
Triton kernel against the reference (bit-exact caches outside the written slots, NaN-poisoned
rows stay NaN), the reference against float64 math, strided qkv views, bad input."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.attention as ref
import tskernels_ref.norm as ref_norm
import tskernels_ref.rope as ref_rope
from tskernels.numerics import assert_close


@st.composite
def problems(draw):
    d = draw(st.sampled_from([16, 64, 80, 128]))
    hkv = draw(st.integers(1, 4))
    return dict(T=draw(st.integers(0, 9)), hkv=hkv, hq=hkv * draw(st.sampled_from([1, 2, 4, 5])),
                d=d, rot=draw(st.sampled_from(sorted({d, d // 2, 16}))),
                style=draw(st.sampled_from(["neox", "gptj"])), norm=draw(st.booleans()),
                page=draw(st.sampled_from([1, 4, 16])), pages=draw(st.integers(3, 8)),
                pos32=draw(st.booleans()),
                dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])))


def _problem(p, device, dtype):
    """q/k/v as strided views of one qkv row [T, (Hq + 2 Hkv) * D], NaN-filled caches,
    permuted slots with one padding token (-1)."""
    T, hq, hkv, d = p["T"], p["hq"], p["hkv"], p["d"]
    T = min(T, p["pages"] * p["page"])
    qkv = torch.randn(T, (hq + 2 * hkv) * d).to(device, dtype)
    q, k, v = (x.view(T, h, d) for x, h in zip(qkv.split([hq * d, hkv * d, hkv * d], dim=-1),
                                               (hq, hkv, hkv)))
    pos = torch.randint(0, 4096, (T,), device=device)
    pos = pos.to(torch.int32) if p.get("pos32") else pos
    slots = torch.randperm(p["pages"] * p["page"])[:T].to(device)
    if T > 2:
        slots[1] = -1
    kc = torch.full((p["pages"], p["page"], hkv, d), float("nan")).to(device, dtype)
    w = [(torch.rand(d) + 0.5).to(device, dtype) if p["norm"] else None for _ in range(2)]
    cache = tskernels.rope.cos_sin_cache(4096, p["rot"], device=device)
    return q, k, v, pos, cache, kc, kc.clone(), slots, w


def _nan_equal(a, b):
    return torch.equal(a.float().nan_to_num(7.5), b.float().nan_to_num(7.5))


@given(seed=st.integers(0, 2**31 - 1), p=problems())
def test_rope_store_kv_triton(kernel_device, seed, p):
    torch.manual_seed(seed)
    q, k, v, pos, cache, kc, vc, slots, w = _problem(p, kernel_device, p["dtype"])
    kc_ref, vc_ref = kc.clone(), vc.clone()
    want = ref.rope_store_kv(q, k, v, pos, cache, kc_ref, vc_ref, slots, style=p["style"],
                             q_norm_weight=w[0], k_norm_weight=w[1])
    got = tskernels.attention.rope_store_kv(q, k, v, pos, cache, kc, vc, slots,
                                            style=p["style"], q_norm_weight=w[0],
                                            k_norm_weight=w[1], backend="triton")
    assert got.shape == q.shape and got.is_contiguous() and got.dtype == q.dtype
    assert_close(got, want.double(), baseline=want, name="q_out")
    # the same rows written, nothing outside the slots (the NaN rows stay NaN), v bit-exact
    assert torch.equal(kc.isnan(), kc_ref.isnan())
    assert _nan_equal(vc, vc_ref)
    assert_close(kc.nan_to_num(7.5), kc_ref.nan_to_num(7.5).double(),
                 baseline=kc_ref.nan_to_num(7.5), name="k_cache")


@given(seed=st.integers(0, 2**31 - 1), p=problems())
def test_rope_store_kv_matches_separate_ops(kernel_device, seed, p):
    """The fused kernel against rmsnorm -> apply_rope -> store_kv as serving ran them (each
    Triton); the norm's sum is taken in another order, so within the dtype's tolerance."""
    torch.manual_seed(seed)
    q, k, v, pos, cache, kc, vc, slots, w = _problem(p, kernel_device, p["dtype"])
    kc_sep, vc_sep = kc.clone(), vc.clone()
    qs, ks = q, k
    if p["norm"]:
        qs = tskernels.norm.rmsnorm(q, w[0], 1e-6, backend="triton")
        ks = tskernels.norm.rmsnorm(k, w[1], 1e-6, backend="triton")
    qs, ks = tskernels.rope.apply_rope(qs, ks, pos, cache, style=p["style"], backend="triton")
    tskernels.attention.store_kv(ks, v, kc_sep, vc_sep, slots, backend="triton")
    got = tskernels.attention.rope_store_kv(q, k, v, pos, cache, kc, vc, slots,
                                            style=p["style"], q_norm_weight=w[0],
                                            k_norm_weight=w[1], backend="triton")
    if not p["norm"]:  # no reduction: the same arithmetic, bit for bit
        assert torch.equal(got, qs) and _nan_equal(kc, kc_sep)
    assert_close(got, qs.double(), baseline=qs, name="q_out")
    assert torch.equal(kc.isnan(), kc_sep.isnan()) and _nan_equal(vc, vc_sep)


@given(seed=st.integers(0, 2**31 - 1), p=problems())
def test_reference_against_float64_math(seed, p):
    """The reference (float32 math, rounded as the separate ops round) against the same
    composition done in float64 from the same inputs."""
    torch.manual_seed(seed)
    q, k, v, pos, cache, kc, vc, slots, w = _problem(p, "cpu", p["dtype"])
    got = ref.rope_store_kv(q, k, v, pos, cache, kc, vc, slots, style=p["style"],
                            q_norm_weight=w[0], k_norm_weight=w[1])
    q64, k64 = q.double(), k.double()
    if p["norm"]:
        q64, k64 = (ref_norm.rmsnorm(x, wt.double()) for x, wt in ((q64, w[0]), (k64, w[1])))
    q64, k64 = ref_rope.apply_rope(q64, k64, pos, cache.double(), style=p["style"])
    assert_close(got, q64, name="q_out")
    keep = slots >= 0
    flat = kc.view(-1, p["hkv"], p["d"])
    assert_close(flat[slots[keep]], k64[keep], name="k rows")
    assert torch.equal(vc.view(-1, p["hkv"], p["d"])[slots[keep]], v[keep])
    written = torch.zeros(flat.shape[0], dtype=torch.bool)
    written[slots[keep]] = True
    assert bool(flat[~written].isnan().all()), "a row outside slot_mapping was written"


@pytest.mark.parametrize("norm", [False, True])
def test_chained_rope_store_kv(kernel_device, monkeypatch, norm):
    """The chained launch (shared/pdl.CHAIN "rope_store_kv") writes what the plain one writes,
    skipped slots (-1) included: its wait comes before the skip."""
    from tskernels.ops.shared import pdl
    p = dict(T=5, hq=8, hkv=2, d=64, rot=64, norm=norm, page=4, pages=4)
    q, k, v, pos, cache, kc, vc, slots, w = _problem(p, kernel_device, torch.float16)
    kw = dict(style="neox", q_norm_weight=w[0], k_norm_weight=w[1], backend="triton")
    monkeypatch.setattr(pdl, "CHAIN", frozenset())
    kc0, vc0 = kc.clone(), vc.clone()
    want = tskernels.attention.rope_store_kv(q, k, v, pos, cache, kc0, vc0, slots, **kw)
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"rope_store_kv"}))
    got = tskernels.attention.rope_store_kv(q, k, v, pos, cache, kc, vc, slots, **kw)
    assert torch.equal(got, want) and _nan_equal(kc, kc0) and _nan_equal(vc, vc0)


def test_rope_store_kv_rejects_bad_input():
    T, hq, hkv, d = 2, 4, 2, 16
    q, k = torch.randn(T, hq, d), torch.randn(T, hkv, d)
    kc = torch.zeros(2, 4, hkv, d)
    pos, slots = torch.tensor([0, 1]), torch.tensor([0, 1])
    cache = tskernels.rope.cos_sin_cache(16, d)
    op = tskernels.attention.rope_store_kv

    def call(**over):
        a = dict(q=q, k=k, v=k.clone(), positions=pos, cos_sin_cache=cache, k_cache=kc,
                 v_cache=kc.clone(), slot_mapping=slots)
        a.update(over)
        return op(**a)
    with pytest.raises(ValueError, match="fp8"):
        f8 = kc.to(torch.float8_e4m3fn)
        call(k_cache=f8, v_cache=f8.clone())
    with pytest.raises(TypeError, match="slot_mapping"):
        call(slot_mapping=slots.int())
    with pytest.raises(ValueError, match="KV heads"):
        call(k=torch.randn(T, 1, d), v=torch.randn(T, 1, d))
    with pytest.raises(ValueError, match="^v: "):
        call(v=torch.randn(T, hkv + 1, d))
    with pytest.raises(TypeError, match="^k: "):
        call(k=k.half())
    with pytest.raises(ValueError, match="positions"):
        call(positions=torch.tensor([0]))
    with pytest.raises(ValueError, match="cos_sin_cache"):
        call(cos_sin_cache=tskernels.rope.cos_sin_cache(16, 32))
    with pytest.raises(ValueError, match="style"):
        call(style="bad")
    with pytest.raises(ValueError, match="both"):
        call(q_norm_weight=torch.ones(d))
    with pytest.raises(ValueError, match="q_norm_weight"):
        call(q_norm_weight=torch.ones(d + 1), k_norm_weight=torch.ones(d))
    with pytest.raises(ValueError, match="contiguous"):
        call(q=torch.randn(T, hq, 2 * d)[..., ::2])
    with pytest.raises(ValueError, match="k_cache"):
        call(k_cache=torch.zeros(2, 4, hkv, 2 * d), v_cache=torch.zeros(2, 4, hkv, 2 * d))
