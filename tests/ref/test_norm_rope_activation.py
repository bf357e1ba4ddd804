"""tskernels_ref.norm / rope / activation vs naive per-row and per-element float64 formulas."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tskernels_ref import activation, norm, rope

from ._problems import rand

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float64: 1e-12}


def naive_rmsnorm(x, w, eps):
    rows = x.double().reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    for r in range(rows.shape[0]):
        ms = sum(float(v) ** 2 for v in rows[r]) / rows.shape[1]
        out[r] = rows[r] / math.sqrt(ms + eps) * w.double()
    return out.view(x.shape)


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(0, 5), min_size=1, max_size=2), n=st.integers(1, 300), dtype=DTYPES,
       eps=st.sampled_from([1e-6, 1e-5]), seed=st.integers(0, 2**31))
def test_rmsnorm_and_fused_add(lead, n, dtype, eps, seed):
    gen = torch.Generator().manual_seed(seed)
    x, res = rand(*lead, n, gen=gen, scale=3.0).to(dtype), rand(*lead, n, gen=gen).to(dtype)
    w = (1 + rand(n, gen=gen, scale=0.1)).to(dtype)
    y = norm.rmsnorm(x, w, eps)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), naive_rmsnorm(x, w, eps), rtol=TOL[dtype], atol=TOL[dtype])
    y2, new_res = norm.fused_add_rmsnorm(x, res, w, eps)
    want_res = (x.double() + res.double()).to(dtype)  # one rounding of the exact sum
    assert new_res.dtype == dtype and torch.equal(new_res, want_res)
    torch.testing.assert_close(y2.double(), naive_rmsnorm(want_res, w, eps), rtol=TOL[dtype], atol=TOL[dtype])


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=2), inter=st.integers(1, 100), dtype=DTYPES,
       seed=st.integers(0, 2**31))
def test_silu_and_mul(shape, inter, dtype, seed):
    x = rand(*shape, 2 * inter, gen=torch.Generator().manual_seed(seed), scale=3.0).to(dtype)
    y = activation.silu_and_mul(x)
    flat = x.double().reshape(-1, 2 * inter)
    want = torch.empty(flat.shape[0], inter, dtype=torch.float64)
    for r in range(flat.shape[0]):
        for i in range(inter):
            g, u = float(flat[r, i]), float(flat[r, inter + i])
            want[r, i] = g / (1 + math.exp(-g)) * u
    assert y.dtype == dtype and y.shape == (*shape, inter)
    torch.testing.assert_close(y.double().reshape(-1, inter), want, rtol=TOL[dtype], atol=TOL[dtype])


def naive_inv_freq(rotary_dim, base, scaling):
    freqs = []
    for i in range(rotary_dim // 2):
        f = base ** (-2 * i / rotary_dim)
        if scaling and scaling["type"] == "llama3":
            wavelen = 2 * math.pi / f
            old = scaling["original_max_position_embeddings"]
            lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
            if wavelen < old / hi:
                pass
            elif wavelen > old / lo:
                f = f / scaling["factor"]
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                f = (1 - smooth) * f / scaling["factor"] + smooth * f
        freqs.append(f)
    return freqs


SCALINGS = st.sampled_from([
    None,
    {"type": "linear", "factor": 4.0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])


@settings(max_examples=30, deadline=None)
@given(t=st.integers(0, 6), hq=st.sampled_from([1, 3, 4]), hk=st.sampled_from([1, 2]),
       head_dim=st.sampled_from([8, 16, 64, 128]), partial=st.sampled_from([1.0, 0.5, 0.25]),
       style=st.sampled_from(["neox", "gptj"]), scaling=SCALINGS,
       base=st.sampled_from([10000.0, 500000.0]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**31))
def test_rope(t, hq, hk, head_dim, partial, style, scaling, base, dtype, seed):
    rotary_dim = max(2, int(head_dim * partial)) // 2 * 2
    max_pos = 4096
    cache = rope.cos_sin_cache(max_pos, rotary_dim, base, scaling=scaling)
    assert cache.shape == (max_pos, rotary_dim) and cache.dtype == torch.float32
    inv = naive_inv_freq(rotary_dim, base, scaling)
    div = scaling["factor"] if scaling and scaling["type"] == "linear" else 1.0
    for p in (0, 1, 777, max_pos - 1):
        for i, f in enumerate(inv):
            assert abs(float(cache[p, i]) - math.cos(p / div * f)) < 1e-6
            assert abs(float(cache[p, rotary_dim // 2 + i]) - math.sin(p / div * f)) < 1e-6

    gen = torch.Generator().manual_seed(seed)
    q, k = rand(t, hq, head_dim, gen=gen).to(dtype), rand(t, hk, head_dim, gen=gen).to(dtype)
    positions = torch.randint(0, max_pos, (t,), generator=gen)
    q_out, k_out = rope.apply_rope(q, k, positions, cache, style=style,
                                   rotary_dim=rotary_dim if partial < 1 else None)
    for x, out in ((q, q_out), (k, k_out)):
        want = x.double().clone()
        for ti in range(t):
            for h in range(x.shape[1]):
                for i in range(rotary_dim // 2):
                    a, b = (i, i + rotary_dim // 2) if style == "neox" else (2 * i, 2 * i + 1)
                    theta = float(positions[ti]) / div * inv[i]
                    xa, xb = float(x[ti, h, a]), float(x[ti, h, b])
                    want[ti, h, a] = xa * math.cos(theta) - xb * math.sin(theta)
                    want[ti, h, b] = xb * math.cos(theta) + xa * math.sin(theta)
        assert out.dtype == dtype and out.shape == x.shape
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
