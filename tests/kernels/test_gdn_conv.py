"""Triton causal conv1d (ragged prefill with rolling state, decode update) and GDN gates vs the
float64 references: empty and one-token sequences, sequences shorter than the kernel width,
NaN-poisoned unused state slots, prefill in pieces equal to one prefill."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gdn as ref
from tskernels.numerics import assert_close

from ..conftest import HAS_CUDA

gdn = tskernels.gdn
DTYPES = [torch.float32, torch.bfloat16] if HAS_CUDA else [torch.float32, torch.float16]
EXAMPLES = 30 if HAS_CUDA else 10


def conv_problem(lens, dim, width, dtype, device, seed, num_slots):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), dim, generator=gen)
    w = torch.randn(dim, width, generator=gen) / width
    b = torch.randn(dim, generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[:len(lens)]
    state = torch.full((num_slots, dim, width - 1), float("nan"))
    state[slots] = torch.randn(len(lens), dim, width - 1, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()],
                      dtype=torch.int32)
    to = lambda t: t.to(device, dtype)  # noqa: E731
    return to(x), to(w), to(b), to(state), slots.to(device, torch.int32), cu.to(device)


@settings(max_examples=EXAMPLES)
@given(lens=st.lists(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 150)), min_size=1,
                     max_size=4),
       dim=st.sampled_from([3, 130]), width=st.sampled_from([2, 4]),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), silu=st.booleans(),
       with_state=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_causal_conv1d(kernel_device, lens, dim, width, dtype, bias, silu, with_state, seed):
    x, w, b, state, slots, cu = conv_problem(lens, dim, width, dtype, kernel_device, seed,
                                             len(lens) + 2)
    act = "silu" if silu else None
    bb = b if bias else None
    got_state = state.clone() if with_state else None
    want_state = state.cpu().double() if with_state else None
    y = gdn.causal_conv1d(x, w, bb, cu_seqlens=cu, conv_state=got_state,
                          state_slots=slots if with_state else None, activation=act,
                          backend="triton")
    want = ref.causal_conv1d(x.cpu().double(), w.cpu().double(),
                             None if bb is None else bb.cpu().double(), cu_seqlens=cu.cpu(),
                             conv_state=want_state,
                             state_slots=slots.cpu() if with_state else None, activation=act)
    assert_close(y, want, name="conv y")
    if with_state:  # NaN slots stay NaN, used ones hold the last W-1 inputs
        assert_close(got_state, want_state, name="conv state")


@settings(max_examples=EXAMPLES)
@given(lens=st.lists(st.integers(0, 100), min_size=1, max_size=3), cut=st.floats(0, 1),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_conv_prefill_in_pieces_then_decode(kernel_device, lens, cut, dtype, seed):
    """Prefill split at any point, then one decode token, equals one long prefill."""
    width, dim = 4, 130
    x, w, b, state, slots, _ = conv_problem([n + 1 for n in lens], dim, width, dtype,
                                            kernel_device, seed, len(lens) + 1)
    full_state = state.clone()
    cu_full = torch.tensor([0, *torch.tensor([n + 1 for n in lens]).cumsum(0).tolist()],
                           dtype=torch.int32, device=kernel_device)
    y_full = gdn.causal_conv1d(x, w, b, cu_seqlens=cu_full, conv_state=full_state,
                               state_slots=slots, backend="triton")
    bounds = cu_full.tolist()
    first = [int(n * cut) for n in lens]
    parts = ([(bounds[i], bounds[i] + f) for i, f in enumerate(first)],
             [(bounds[i] + f, bounds[i + 1] - 1) for i, f in enumerate(first)])
    got = torch.empty_like(y_full)
    for part in parts:
        idx = torch.cat([torch.arange(s, e) for s, e in part]).to(kernel_device)
        cu = torch.tensor([0, *torch.tensor([e - s for s, e in part]).cumsum(0).tolist()],
                          dtype=torch.int32, device=kernel_device)
        got[idx] = gdn.causal_conv1d(x[idx], w, b, cu_seqlens=cu, conv_state=state,
                                     state_slots=slots, backend="triton")
    last = torch.tensor([bounds[i + 1] - 1 for i in range(len(lens))], device=kernel_device)
    got[last] = gdn.causal_conv1d_update(x[last], state, w, b, state_slots=slots,
                                         backend="triton")
    assert_close(got, y_full.double(), name="pieces y")
    assert_close(state, full_state.double(), name="pieces state")


@settings(max_examples=EXAMPLES)
@given(batch=st.integers(1, 6), dim=st.sampled_from([5, 200]), width=st.sampled_from([2, 3, 4]),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), silu=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_causal_conv1d_update(kernel_device, batch, dim, width, dtype, bias, silu, seed):
    x, w, b, state, slots, _ = conv_problem([1] * batch, dim, width, dtype, kernel_device, seed,
                                            batch + 3)
    x = x[:batch]
    act = "silu" if silu else None
    bb = b if bias else None
    want_state = state.cpu().double()
    y = gdn.causal_conv1d_update(x, state, w, bb, state_slots=slots, activation=act,
                                 backend="triton")
    want = ref.causal_conv1d_update(x.cpu().double(), want_state, w.cpu().double(),
                                    None if bb is None else bb.cpu().double(),
                                    state_slots=slots.cpu(), activation=act)
    assert_close(y, want, name="update y")
    assert_close(state, want_state, name="update state")


@settings(max_examples=EXAMPLES)
@given(n=st.integers(0, 300), heads=st.sampled_from([1, 3, 32]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_gate(kernel_device, n, heads, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, heads, generator=gen) * 8).to(kernel_device, dtype)  # softplus's both ends
    b = torch.randn(n, heads, generator=gen).to(kernel_device, dtype)
    A_log = torch.randn(heads, generator=gen).to(kernel_device)
    dt_bias = torch.randn(heads, generator=gen).to(kernel_device)
    g, beta = gdn.gate(a, b, A_log, dt_bias, backend="triton")
    assert g.dtype == torch.float32 and beta.dtype == dtype
    want_g, want_b = ref.gate(a.cpu().double(), b.cpu().double(), A_log.cpu().double(),
                              dt_bias.cpu().double())
    assert_close(g, want_g, name="g")
    assert_close(beta, want_b, name="beta")
