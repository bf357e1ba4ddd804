"""RoPE kernel vs the float64 reference: neox and gptj, partial rotary, in place."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.rope as ref
from tskernels.numerics import assert_close


@st.composite
def rope_problems(draw):
    d = draw(st.sampled_from([16, 32, 64, 80, 128]))
    rot = draw(st.sampled_from([r for r in (8, 16, 32, 64, 128) if r <= d] + [d]))
    return dict(T=draw(st.integers(0, 9)), hq=draw(st.integers(1, 20)), hk=draw(st.integers(1, 4)),
                d=d, rot=rot, style=draw(st.sampled_from(["neox", "gptj"])),
                dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
                inplace=draw(st.booleans()),
                scaling=draw(st.sampled_from([None, {"type": "linear", "factor": 2.0}])))


@given(seed=st.integers(0, 2**31 - 1), p=rope_problems())
def test_rope_triton(kernel_device, seed, p):
    torch.manual_seed(seed)
    cache = tskernels.rope.cos_sin_cache(4096, p["rot"], 10000.0, scaling=p["scaling"],
                                         device=kernel_device)
    q = torch.randn(p["T"], p["hq"], p["d"]).to(kernel_device, p["dtype"])
    k = torch.randn(p["T"], p["hk"], p["d"]).to(kernel_device, p["dtype"])
    pos = torch.randint(0, 4096, (p["T"],), device=kernel_device)
    q64, k64 = ref.apply_rope(q.double(), k.double(), pos, cache.double(), style=p["style"])
    qb, kb = ref.apply_rope(q, k, pos, cache, style=p["style"])
    q_in, k_in = q.clone(), k.clone()
    qo, ko = tskernels.rope.apply_rope(q_in, k_in, pos, cache, style=p["style"],
                                       inplace=p["inplace"], backend="triton")
    if p["T"]:
        assert (qo.data_ptr() == q_in.data_ptr()) == p["inplace"]
    assert_close(qo, q64, baseline=qb, name="q")
    assert_close(ko, k64, baseline=kb, name="k")
    # Dims past the rotary width are untouched.
    torch.testing.assert_close(qo[..., p["rot"]:], q[..., p["rot"]:], rtol=0, atol=0)


def test_rope_styles_differ_and_position_zero_is_identity(kernel_device):
    cache = tskernels.rope.cos_sin_cache(16, 8, device=kernel_device)
    q = torch.randn(2, 1, 8, device=kernel_device)
    pos = torch.tensor([0, 3], device=kernel_device)
    a, _ = tskernels.rope.apply_rope(q, None, pos, cache, style="neox", backend="triton")
    b, _ = tskernels.rope.apply_rope(q, None, pos, cache, style="gptj", backend="triton")
    torch.testing.assert_close(a[0], q[0])
    assert not torch.allclose(a[1], b[1])


def test_rope_rejects_bad_input():
    cache = tskernels.rope.cos_sin_cache(16, 8)
    q = torch.randn(2, 1, 8)
    with pytest.raises(ValueError, match="style"):
        tskernels.rope.apply_rope(q, None, torch.tensor([0, 1]), cache, style="bad")
    with pytest.raises(ValueError, match="positions"):
        tskernels.rope.apply_rope(q, None, torch.tensor([0]), cache)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        tskernels.rope.apply_rope(torch.randn(2, 1, 4), None, torch.tensor([0, 1]), cache)


def test_yarn_table_matches_transformers():
    """tskernels.rope.cos_sin_cache(scaling=yarn) = cos / sin of HF's YaRN frequencies times
    its attention factor (DeepSeek-V3 style config, mscale and mscale_all_dim)."""
    pytest.importorskip("transformers")
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    s = dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
             beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.707)
    cfg = DeepseekV3Config(qk_rope_head_dim=64, rope_scaling=s, rope_theta=10000.0,
                           max_position_embeddings=163840)
    inv_freq, attn = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    table = tskernels.rope.cos_sin_cache(256, 64, 10000.0, scaling=s)
    freqs = torch.outer(torch.arange(256, dtype=torch.float32), inv_freq.float())
    want = torch.cat([freqs.cos() * attn, freqs.sin() * attn], dim=-1)
    assert torch.allclose(table, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not supported"):
        tskernels.rope.cos_sin_cache(16, 8, scaling={"rope_type": "longrope"})


@pytest.mark.parametrize("chain,one_launch", [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("hq,hk,inplace", [(6, 2, False), (2, 5, True), (3, 3, False)])
def test_one_launch_and_chained_rope(kernel_device, monkeypatch, chain, one_launch, hq, hk,
                                     inplace):
    """q and k through one launch (ONE_LAUNCH, q's config for both; more k than q heads
    too) and the chained launch (shared/pdl.CHAIN "rope") match the reference; partial
    rotary (dims past it copied), in place or not; q alone as well."""
    from tskernels.ops.rope import triton as rope_triton
    from tskernels.ops.shared import pdl
    monkeypatch.setattr(rope_triton, "ONE_LAUNCH", one_launch)
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"rope"} if chain else ()))
    cache = tskernels.rope.cos_sin_cache(64, 16, device=kernel_device)
    q = torch.randn(3, hq, 24).to(kernel_device, torch.float16)
    k = torch.randn(3, hk, 24).to(kernel_device, torch.float16)
    pos = torch.tensor([0, 7, 63], device=kernel_device)
    q64, k64 = ref.apply_rope(q.double(), k.double(), pos, cache.double(), style="neox")
    qb, kb = ref.apply_rope(q, k, pos, cache, style="neox")
    q_in, k_in = q.clone(), k.clone()
    qo, ko = tskernels.rope.apply_rope(q_in, k_in, pos, cache, style="neox", inplace=inplace,
                                       backend="triton")
    assert (qo.data_ptr() == q_in.data_ptr()) == inplace
    assert (ko.data_ptr() == k_in.data_ptr()) == inplace
    assert_close(qo, q64, baseline=qb, name="q")
    assert_close(ko, k64, baseline=kb, name="k")
    torch.testing.assert_close(ko[..., 16:], k[..., 16:], rtol=0, atol=0)
    qa, none = tskernels.rope.apply_rope(q, None, pos, cache, style="neox", backend="triton")
    assert none is None
    assert_close(qa, q64, baseline=qb, name="q alone")


@pytest.mark.parametrize("chain", [False, True])
def test_one_launch_only_up_to_its_token_bound(kernel_device, monkeypatch, chain):
    """ONE_LAUNCH pairs q and k only up to ONE_LAUNCH_MAX_T tokens (past it one launch each
    was faster on the H200); both forms give the reference's values."""
    from tskernels.ops.rope import triton as rope_triton
    from tskernels.ops.shared import pdl
    monkeypatch.setattr(rope_triton, "ONE_LAUNCH", True)
    monkeypatch.setattr(rope_triton, "ONE_LAUNCH_MAX_T", 2)
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"rope"} if chain else ()))
    calls = []
    for name in ("_qk_pair", "_rotate"):
        real = getattr(rope_triton, name)
        monkeypatch.setattr(rope_triton, name,
                            lambda *a, _n=name, _f=real, **kw: calls.append(_n) or _f(*a, **kw))
    cache = tskernels.rope.cos_sin_cache(64, 16, device=kernel_device)
    for t, launches in ((2, 1), (3, 2)):
        calls.clear()
        q = torch.randn(t, 4, 16).to(kernel_device, torch.float16)
        k = torch.randn(t, 2, 16).to(kernel_device, torch.float16)
        pos = torch.arange(t, device=kernel_device) * 5
        q64, k64 = ref.apply_rope(q.double(), k.double(), pos, cache.double(), style="neox")
        qb, kb = ref.apply_rope(q, k, pos, cache, style="neox")
        qo, ko = tskernels.rope.apply_rope(q, k, pos, cache, style="neox", backend="triton")
        assert len(calls) == launches, calls
        assert_close(qo, q64, baseline=qb, name="q")
        assert_close(ko, k64, baseline=kb, name="k")
