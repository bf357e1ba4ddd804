"""tskernels_ref.gdn (chunked WY form, decode step) vs the token-by-token recurrence in float64."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tskernels_ref import gdn

from ._problems import indptr, rand


def naive_recurrence(q, k, v, g, beta, state, scale):
    """One sequence, float64, per token and per head: q,k [L,H,K], v [L,H,V], state [H,K,V]."""
    state = state.double().clone()
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            S = state[h] * math.exp(float(g[t, h]))
            kt, vt = k[t, h].double(), v[t, h].double()
            S = S + float(beta[t, h]) * torch.outer(kt, vt - S.T @ kt)
            out[t, h] = S.T @ (q[t, h].double() * scale)
            state[h] = S
    return out, state


def make_inputs(total, heads, dk, dv, gen, normalize=True):
    q, k = rand(total, heads, dk, gen=gen), rand(total, heads, dk, gen=gen)
    if normalize:  # unit keys keep the delta rule contractive, as the models' l2-norm does
        k = k / k.norm(dim=-1, keepdim=True)
    v = rand(total, heads, dv, gen=gen)
    g = -torch.nn.functional.softplus(rand(total, heads, gen=gen, scale=2.0))
    beta = torch.sigmoid(rand(total, heads, gen=gen))
    return q.float(), k.float(), v.float(), g.float(), beta.float()


@settings(max_examples=20, deadline=None)
@given(lens=st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 150)), min_size=1, max_size=3),
       heads=st.sampled_from([1, 2, 3]), dk=st.sampled_from([4, 16, 32]), dv=st.sampled_from([4, 8, 32]),
       chunk=st.sampled_from([8, 16, 64]), with_state=st.booleans(), seed=st.integers(0, 2**31))
def test_chunk_prefill_matches_recurrence(lens, heads, dk, dv, chunk, with_state, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta = make_inputs(sum(lens), heads, dk, dv, gen)
    init = rand(len(lens), heads, dk, dv, gen=gen, scale=0.5).float() if with_state else None
    o, final = gdn.chunk_prefill(q, k, v, g, beta, cu_seqlens=indptr(lens), initial_state=init, chunk_size=chunk)
    assert o.shape == (sum(lens), heads, dv) and o.dtype == torch.float32 and final.dtype == torch.float32
    bounds = indptr(lens).tolist()
    scale = 1 / math.sqrt(dk)
    for n in range(len(lens)):
        s, e = bounds[n], bounds[n + 1]
        start = init[n] if with_state else torch.zeros(heads, dk, dv)
        want_o, want_s = naive_recurrence(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], start, scale)
        torch.testing.assert_close(o[s:e].double(), want_o, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(final[n].double(), want_s, rtol=1e-4, atol=1e-4)


def test_chunk_prefill_float64_and_l2norm():
    gen = torch.Generator().manual_seed(3)
    lens = [70, 0, 5]
    q, k, v, g, beta = make_inputs(sum(lens), 2, 16, 8, gen, normalize=False)
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    o, final = gdn.chunk_prefill(q, k, v, g, beta, cu_seqlens=indptr(lens), scale=0.3, chunk_size=32,
                                 use_qk_l2norm=True)
    assert o.dtype == final.dtype == torch.float64
    norm = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    bounds = indptr(lens).tolist()
    for n in range(len(lens)):
        s, e = bounds[n], bounds[n + 1]
        want_o, want_s = naive_recurrence(norm(q[s:e]), norm(k[s:e]), v[s:e], g[s:e], beta[s:e],
                                          torch.zeros(2, 16, 8), 0.3)
        torch.testing.assert_close(o[s:e], want_o, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(final[n], want_s, rtol=1e-10, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 5), heads=st.sampled_from([1, 4]), dk=st.sampled_from([4, 32]),
       dv=st.sampled_from([4, 16]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**31))
def test_decode_step_in_place(batch, heads, dk, dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta = make_inputs(batch, heads, dk, dv, gen)
    num_slots = batch + 3
    state = rand(num_slots, heads, dk, dv, gen=gen, scale=0.5).float()
    before = state.clone()
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    o = gdn.decode_step(q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), state, slots)
    assert o.dtype == dtype and o.shape == (batch, heads, dv)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for b in range(batch):
        cast = lambda x: x[b : b + 1].to(dtype)
        want_o, want_s = naive_recurrence(cast(q), cast(k), cast(v), g[b : b + 1], cast(beta),
                                          before[int(slots[b])], 1 / math.sqrt(dk))
        torch.testing.assert_close(o[b].double(), want_o[0], rtol=tol, atol=tol)
        torch.testing.assert_close(state[int(slots[b])].double(), want_s, rtol=1e-5, atol=1e-5)
    untouched = [s for s in range(num_slots) if s not in slots.tolist()]
    assert torch.equal(state[untouched], before[untouched])


def test_prefill_then_decode_continues_the_sequence():
    gen = torch.Generator().manual_seed(4)
    q, k, v, g, beta = make_inputs(41, 2, 16, 16, gen)
    o_all, s_all = gdn.chunk_prefill(q, k, v, g, beta, cu_seqlens=indptr([41]), chunk_size=16)
    o_pre, s_pre = gdn.chunk_prefill(q[:40], k[:40], v[:40], g[:40], beta[:40], cu_seqlens=indptr([40]))
    state = torch.zeros(3, 2, 16, 16)
    state[2] = s_pre[0]
    o_last = gdn.decode_step(q[40:], k[40:], v[40:], g[40:], beta[40:], state, torch.tensor([2], dtype=torch.int32))
    torch.testing.assert_close(o_last, o_all[40:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[2], s_all[0], rtol=1e-5, atol=1e-5)


def test_grouped_value_heads_read_their_key_head():
    """HV = 2 HK: value head h follows the recurrence with key / query head h // 2."""
    gen = torch.Generator().manual_seed(5)
    lens = [37, 1, 0]
    q, k, v, g, beta = make_inputs(sum(lens), 4, 16, 8, gen)
    q, k = q[:, ::2].contiguous(), k[:, ::2].contiguous()  # 2 key heads
    o, final = gdn.chunk_prefill(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                 cu_seqlens=indptr(lens), chunk_size=16)
    rep = lambda x: x.repeat_interleave(2, dim=1)  # noqa: E731
    bounds = indptr(lens).tolist()
    for n in range(len(lens)):
        s, e = bounds[n], bounds[n + 1]
        want_o, want_s = naive_recurrence(rep(q[s:e]), rep(k[s:e]), v[s:e], g[s:e], beta[s:e],
                                          torch.zeros(4, 16, 8), 16 ** -0.5)
        torch.testing.assert_close(o[s:e], want_o, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(final[n], want_s, rtol=1e-10, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(lens=st.lists(st.integers(0, 12), min_size=1, max_size=3), width=st.sampled_from([2, 3, 4]),
       with_state=st.booleans(), silu=st.booleans(), seed=st.integers(0, 2**31))
def test_causal_conv1d_matches_torch_conv(lens, width, with_state, silu, seed):
    """Each sequence, its state prepended, through torch's grouped conv1d in float64."""
    gen = torch.Generator().manual_seed(seed)
    dim = 5
    x, w, b = rand(sum(lens), dim, gen=gen), rand(dim, width, gen=gen), rand(dim, gen=gen)
    state = rand(len(lens) + 1, dim, width - 1, gen=gen)
    slots = torch.randperm(len(lens) + 1, generator=gen)[: len(lens)]
    before = state.clone()
    y = gdn.causal_conv1d(x, w, b, cu_seqlens=indptr(lens), conv_state=state if with_state else None,
                          state_slots=slots if with_state else None,
                          activation="silu" if silu else None)
    bounds = indptr(lens).tolist()
    for n in range(len(lens)):
        s, e = bounds[n], bounds[n + 1]
        prev = before[slots[n]] if with_state else torch.zeros(dim, width - 1, dtype=torch.float64)
        seq = torch.cat([prev, x[s:e].T], dim=1)  # [D, W-1 + L]
        if e > s:  # (torch's conv refuses an input shorter than its kernel)
            want = torch.nn.functional.conv1d(seq[None], w[:, None, :], b, groups=dim)[0].T
            want = torch.nn.functional.silu(want) if silu else want
            torch.testing.assert_close(y[s:e], want, rtol=1e-12, atol=1e-12)
        if with_state:
            torch.testing.assert_close(state[slots[n]], seq[:, -(width - 1):])
    if with_state:
        unused = [i for i in range(len(lens) + 1) if i not in slots.tolist()]
        assert torch.equal(state[unused], before[unused])


def test_conv1d_update_is_one_more_prefill_token():
    gen = torch.Generator().manual_seed(2)
    x, w = rand(6, 4, gen=gen), rand(4, 4, gen=gen)
    state = torch.zeros(2, 4, 3, dtype=torch.float64)
    slot = torch.tensor([1])
    y_all = gdn.causal_conv1d(x, w, cu_seqlens=indptr([6]), conv_state=state.clone(), state_slots=slot)
    gdn.causal_conv1d(x[:5], w, cu_seqlens=indptr([5]), conv_state=state, state_slots=slot)
    y = gdn.causal_conv1d_update(x[5:], state, w, state_slots=slot)
    torch.testing.assert_close(y, y_all[5:], rtol=1e-12, atol=1e-12)


def test_gate_formula():
    gen = torch.Generator().manual_seed(1)
    a, b = rand(5, 3, gen=gen, scale=10.0), rand(5, 3, gen=gen)
    A_log, dt_bias = rand(3, gen=gen), rand(3, gen=gen)
    g, beta = gdn.gate(a, b, A_log, dt_bias)
    x = a + dt_bias
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    torch.testing.assert_close(g, -torch.exp(A_log) * softplus, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(beta, 1 / (1 + torch.exp(-b)), rtol=1e-12, atol=1e-12)
