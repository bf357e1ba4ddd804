"""Public gdn ops: equal to tskernels_ref on CPU, reference selected there, bad input named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gdn as ref

from ._helpers import assert_reference_selected, assert_same

gdn = tskernels.gdn


def inputs(n: int, heads: int, dk: int, dv: int, dtype=torch.float32) -> dict:
    return dict(q=torch.randn(n, heads, dk).to(dtype), k=torch.randn(n, heads, dk).to(dtype),
                v=torch.randn(n, heads, dv).to(dtype), g=F.logsigmoid(torch.randn(n, heads)),
                beta=torch.rand(n, heads))


@given(lens=st.lists(st.integers(0, 20), min_size=1, max_size=3), heads=st.integers(1, 2),
       dk=st.sampled_from([4, 8]), dv=st.sampled_from([4, 16]),
       chunk_size=st.sampled_from([4, 16, 64]), with_state=st.booleans(), l2=st.booleans())
def test_chunk_prefill_equals_reference(lens, heads, dk, dv, chunk_size, with_state, l2):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = inputs(int(cu[-1]), heads, dk, dv)
    state = torch.randn(len(lens), heads, dk, dv) if with_state else None
    kw = dict(cu_seqlens=cu, initial_state=state, scale=0.3, chunk_size=chunk_size,
              use_qk_l2norm=l2)
    assert_same(gdn.chunk_prefill(**x, **kw), ref.chunk_prefill(**x, **kw))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("l2", [False, True])
def test_decode_step_equals_reference_and_updates_slots(dtype, l2):
    x = inputs(3, 2, 8, 16, dtype)
    state = torch.randn(6, 2, 8, 16)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    got_state, want_state = state.clone(), state.clone()
    got = gdn.decode_step(**x, state=got_state, state_slots=slots, use_qk_l2norm=l2)
    want = ref.decode_step(**x, state=want_state, state_slots=slots, use_qk_l2norm=l2)
    assert_same(got, want)
    assert_same(got_state, want_state)
    assert torch.equal(got_state[[1, 3, 5]], state[[1, 3, 5]])  # untouched slots


@pytest.mark.parametrize("op", ["chunk_prefill", "decode_step"])
def test_reference_selected_on_cpu(op):
    assert_reference_selected("gdn", op, formats={"q": "bf16", "state": "fp32"},
                              traits={"num_heads": 4, "head_dim_k": 128, "head_dim_v": 128})


@pytest.mark.parametrize("op,formats,traits", [
    ("gate", {"a": "bf16", "b": "bf16"}, {"num_heads": 32}),
    ("causal_conv1d", {"x": "bf16"}, {"width": 4, "dim": 8192}),
    ("causal_conv1d_update", {"x": "bf16"}, {"width": 4, "dim": 8192})])
def test_layer_pieces_reference_selected_on_cpu(op, formats, traits):
    assert_reference_selected("gdn", op, formats=formats, traits=traits)


def test_grouped_value_heads_equal_reference():
    """q / k with 2 key heads, v / g / beta / state with 4 value heads."""
    x = inputs(9, 4, 8, 16)
    x["q"], x["k"] = x["q"][:, :2].contiguous(), x["k"][:, :2].contiguous()
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    assert_same(gdn.chunk_prefill(**x, cu_seqlens=cu, use_qk_l2norm=True),
                ref.chunk_prefill(**x, cu_seqlens=cu, use_qk_l2norm=True))
    got = torch.randn(3, 4, 8, 16)
    want = got.clone()
    slots = torch.tensor([2, 0], dtype=torch.int32)
    d = {n: t[:2] for n, t in x.items()}
    assert_same(gdn.decode_step(**d, state=got, state_slots=slots),
                ref.decode_step(**d, state=want, state_slots=slots))
    assert_same(got, want)


def test_gate_equals_reference():
    a, b = torch.randn(7, 3).bfloat16(), torch.randn(7, 3).bfloat16()
    A_log, dt_bias = torch.randn(3), torch.randn(3)
    g, beta = gdn.gate(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == torch.bfloat16
    assert_same((g, beta), ref.gate(a, b, A_log, dt_bias))
    assert (g <= 0).all()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", ["silu", None])
def test_conv1d_equals_reference_and_rolls_state(bias, activation):
    x, w = torch.randn(9, 6), torch.randn(6, 4)
    b = torch.randn(6) if bias else None
    cu = torch.tensor([0, 2, 2, 9], dtype=torch.int32)
    state = torch.randn(5, 6, 3)
    slots = torch.tensor([4, 1, 0], dtype=torch.int32)
    got_s, want_s = state.clone(), state.clone()
    kw = dict(cu_seqlens=cu, state_slots=slots, activation=activation)
    assert_same(gdn.causal_conv1d(x, w, b, conv_state=got_s, **kw),
                ref.causal_conv1d(x, w, b, conv_state=want_s, **kw))
    assert_same(got_s, want_s)
    assert torch.equal(got_s[[2, 3]], state[[2, 3]])  # slots no sequence owns
    assert torch.equal(got_s[1], state[1])  # the empty sequence keeps its state
    assert torch.equal(got_s[0], x[2:9][-3:].T)  # the last W-1 inputs
    y = gdn.causal_conv1d_update(x[:3], got_s, w, b, state_slots=slots, activation=activation)
    assert_same(y, ref.causal_conv1d_update(x[:3], want_s, w, b, state_slots=slots,
                                            activation=activation))
    assert_same(got_s, want_s)


X = inputs(5, 2, 4, 8)
CU = torch.tensor([0, 2, 5], dtype=torch.int32)
STATE = torch.zeros(4, 2, 4, 8)
META = torch.device("meta")


def prefill(**kw):
    args = dict(X, cu_seqlens=CU)
    args.update(kw)
    return lambda: gdn.chunk_prefill(**args)


def decode(**kw):
    args = {name: t[:2] for name, t in X.items()}
    args.update(state=STATE, state_slots=torch.tensor([0, 3], dtype=torch.int32))
    args.update(kw)
    return lambda: gdn.decode_step(**args)


def conv(**kw):
    args = dict(x=torch.zeros(5, 6), weight=torch.zeros(6, 4), bias=None, cu_seqlens=CU,
                conv_state=torch.zeros(4, 6, 3), state_slots=torch.tensor([0, 3], dtype=torch.int32))
    args.update(kw)
    return lambda: gdn.causal_conv1d(**args)


def conv_update(**kw):
    args = dict(x=torch.zeros(2, 6), conv_state=torch.zeros(4, 6, 3), weight=torch.zeros(6, 4),
                state_slots=torch.tensor([0, 3], dtype=torch.int32))
    args.update(kw)
    return lambda: gdn.causal_conv1d_update(**args)


BAD = [
    (prefill(q=X["q"][0]), ValueError, "q: expected 3 dim"),
    (prefill(q=X["q"].long()), TypeError, "q: expected dtype"),
    (prefill(k=X["k"][:, :, :2]), ValueError, "k: expected shape"),
    (prefill(k=X["k"].half()), TypeError, "k: expected dtype float32"),
    (prefill(k=X["k"].to(META)), ValueError, "k: expected a tensor on"),
    (prefill(v=X["v"][:4]), ValueError, "v: expected shape"),
    (prefill(v=X["v"].bfloat16()), TypeError, "v: expected dtype"),
    (prefill(g=X["g"].half()), TypeError, "g: expected dtype"),
    (prefill(g=X["g"][:, :1]), ValueError, "g: expected shape"),
    (prefill(beta=X["beta"][:3]), ValueError, "beta: expected shape"),
    (prefill(cu_seqlens=CU.long()), TypeError, "cu_seqlens: expected dtype int32"),
    (prefill(cu_seqlens=CU[:1]), ValueError, "cu_seqlens: expected N"),
    (prefill(cu_seqlens=torch.tensor([1, 2, 5], dtype=torch.int32)), ValueError,
     "cu_seqlens: expected non-decreasing offsets from 0"),
    (prefill(cu_seqlens=torch.tensor([0, 3, 2, 5], dtype=torch.int32)), ValueError,
     "cu_seqlens: expected non-decreasing"),
    (prefill(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), ValueError,
     "cu_seqlens: expected non-decreasing offsets from 0 to T=5"),
    (prefill(initial_state=torch.zeros(3, 2, 4, 8)), ValueError, "initial_state: expected shape"),
    (prefill(initial_state=torch.zeros(2, 2, 4, 8).half()), TypeError,
     "initial_state: expected dtype"),
    (prefill(scale=-1.0), ValueError, "scale: expected a positive"),
    (prefill(chunk_size=0), ValueError, "chunk_size: expected a positive int"),
    (prefill(chunk_size=16.0), ValueError, "chunk_size: expected a positive int"),
    (decode(q=X["q"][:2, :1]), ValueError, "k: expected shape"),
    (decode(state=STATE[:, :1]), ValueError, "state: expected shape"),
    (decode(state=STATE.half()), TypeError, "state: expected dtype"),
    (decode(state=STATE.to(META)), ValueError, "state: expected a tensor on"),
    (decode(state=torch.zeros(4, 2, 8, 4).transpose(2, 3)), ValueError,
     "state: expected a contiguous state pool"),
    (decode(state_slots=torch.tensor([0], dtype=torch.int32)), ValueError,
     "state_slots: expected shape"),
    (decode(state_slots=torch.tensor([0.0, 1.0])), TypeError, "state_slots: expected dtype"),
    (decode(state_slots=torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     r"state_slots: expected values in \[0, 4\)"),
    (decode(state_slots=torch.tensor([-1, 2], dtype=torch.int32)), ValueError,
     "state_slots: expected values"),
    (decode(state_slots=torch.tensor([1, 1], dtype=torch.int32)), ValueError,
     "state_slots: expected distinct"),
    (decode(scale=0.0), ValueError, "scale: expected a positive"),
    (prefill(v=torch.zeros(5, 3, 8)), ValueError, "v: 3 must be a multiple of the key heads"),
    (lambda: gdn.gate(torch.zeros(4, 2), torch.zeros(4, 3), torch.zeros(2), torch.zeros(2)),
     ValueError, "b: expected shape"),
    (lambda: gdn.gate(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(3), torch.zeros(2)),
     ValueError, "A_log: expected shape"),
    (lambda: gdn.gate(torch.zeros(4, 2).long(), torch.zeros(4, 2), torch.zeros(2),
                      torch.zeros(2)), TypeError, "a: expected dtype"),
    (conv(weight=torch.zeros(6, 4).half()), TypeError, "weight: expected dtype"),
    (conv(weight=torch.zeros(6, 1)), ValueError, "weight: expected a kernel width >= 2"),
    (conv(bias=torch.zeros(5)), ValueError, "bias: expected shape"),
    (conv(conv_state=torch.zeros(4, 6, 2)), ValueError, "conv_state: expected shape"),
    (conv(state_slots=None), ValueError, "state_slots: expected together with conv_state"),
    (conv(state_slots=torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     r"state_slots: expected values in \[0, 4\)"),
    (conv(state_slots=torch.tensor([1, 1], dtype=torch.int32)), ValueError,
     "state_slots: expected distinct"),
    (conv(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), ValueError,
     "cu_seqlens: expected non-decreasing offsets from 0 to T=5"),
    (conv(activation="gelu"), ValueError, "activation: expected 'silu' or None"),
    (conv_update(conv_state=torch.zeros(4, 6, 3).transpose(0, 1).contiguous().transpose(0, 1)),
     ValueError, "conv_state: expected a contiguous tensor"),
    (conv_update(state_slots=torch.tensor([0], dtype=torch.int32)), ValueError,
     "state_slots: expected shape"),
    (conv_update(x=torch.zeros(2, 7)), ValueError, "weight: expected shape"),
]


@pytest.mark.parametrize("call,exc,match", BAD)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
