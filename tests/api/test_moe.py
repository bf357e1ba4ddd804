"""Public moe ops: equal to tskernels_ref on CPU, reference selected there, bad input named."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.moe as ref

from ._helpers import assert_reference_selected, assert_same

moe = tskernels.moe


@given(t=st.integers(0, 12), e=st.integers(1, 40), data=st.data(), renorm=st.booleans())
def test_topk_softmax_equals_reference(t, e, data, renorm):
    k = data.draw(st.integers(1, min(e, 8)))
    logits = torch.randn(t, e).to(data.draw(st.sampled_from([torch.float32, torch.bfloat16])))
    assert_same(moe.topk_softmax(logits, k, renormalize=renorm),
                ref.topk_softmax(logits, k, renormalize=renorm))


@given(t=st.integers(0, 10), n_group=st.sampled_from([1, 2, 4, 8]), per_group=st.integers(1, 6),
       data=st.data(), renorm=st.booleans())
def test_topk_sigmoid_grouped_equals_reference(t, n_group, per_group, data, renorm):
    e = n_group * per_group
    topk_group = data.draw(st.integers(1, n_group))
    k = data.draw(st.integers(1, topk_group * per_group))
    logits, bias = torch.randn(t, e), torch.randn(e) * 0.1
    kw = dict(n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.5,
              renormalize=renorm)
    assert_same(moe.topk_sigmoid_grouped(logits, bias, k, **kw),
                ref.topk_sigmoid_grouped(logits, bias, k, **kw))


@given(t=st.integers(0, 20), k=st.integers(1, 4), e=st.integers(1, 16),
       block_size=st.sampled_from([1, 4, 16]), dtype=st.sampled_from([torch.int32, torch.int64]))
def test_align_by_expert_equals_reference(t, k, e, block_size, dtype):
    ids = torch.randint(-1, e, (t, k), dtype=dtype)  # -1: a non-local expert, dropped
    assert_same(moe.align_by_expert(ids, e, block_size), ref.align_by_expert(ids, e, block_size))


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_experts_and_combine_equal_reference(activation, dtype):
    t, h, inter, e, k = 7, 32, 24, 5, 2
    x = torch.randn(t, h).to(dtype)
    w13, w2 = (torch.randn(e, 2 * inter, h) / 6).to(dtype), (torch.randn(e, h, inter) / 5).to(dtype)
    weights, ids = ref.topk_softmax(torch.randn(t, e), k)
    ids[0, 1] = -1  # a non-local expert contributes nothing
    assert_same(moe.fused_experts(x, w13, w2, weights, ids, activation=activation),
                ref.fused_experts(x, w13, w2, weights, ids, activation=activation))
    expert_out = torch.randn(t, k, h).to(dtype)
    assert_same(moe.combine(expert_out, weights), ref.combine(expert_out, weights))


@pytest.mark.parametrize("op,formats", [
    ("topk_softmax", {"router_logits": "bf16"}),
    ("topk_sigmoid_grouped", {"router_logits": "fp32", "correction_bias": "fp32"}),
    ("align_by_expert", {"topk_ids": "int32"}),
    ("fused_experts", {"x": "bf16", "w": "bf16"}),
    ("combine", {"expert_out": "bf16"}),
])
def test_reference_selected_on_cpu(op, formats):
    assert_reference_selected("moe", op, formats=formats)


T, H, I, E, K = 3, 16, 8, 8, 2
LOGITS, BIAS = torch.randn(T, E), torch.zeros(E)
X, W13, W2 = torch.randn(T, H), torch.randn(E, 2 * I, H), torch.randn(E, H, I)
WEIGHTS, IDS = ref.topk_softmax(LOGITS, K)
META = torch.device("meta")


def grouped(**kw):
    args = dict(router_logits=LOGITS, correction_bias=BIAS, top_k=2, n_group=4, topk_group=2)
    args.update(kw)
    return moe.topk_sigmoid_grouped(**args)


Q13, Q2 = W13.to(torch.float8_e4m3fn), W2.to(torch.float8_e4m3fn)
S13, S2 = torch.ones(E, 1, 1), torch.ones(E, 1, 1)


def test_fused_experts_fp8_equals_reference():
    kw = dict(w13_scale=S13 * 0.5, w2_scale=S2 * 0.25)
    assert_same(moe.fused_experts(X, Q13, Q2, WEIGHTS, IDS, **kw),
                ref.fused_experts(X, Q13, Q2, WEIGHTS, IDS, **kw))


def fused(**kw):
    args = dict(x=X, w13=W13, w2=W2, topk_weights=WEIGHTS, topk_ids=IDS)
    args.update(kw)
    return moe.fused_experts(**args)


BAD = [
    (lambda: moe.topk_softmax(LOGITS[0], 2), ValueError, "router_logits: expected 2 dim"),
    (lambda: moe.topk_softmax(LOGITS.long(), 2), TypeError, "router_logits: expected dtype"),
    (lambda: moe.topk_softmax(LOGITS, 9), ValueError,
     r"top_k: 9 exceeds the number of experts \(8\)"),
    (lambda: moe.topk_softmax(LOGITS, 0), ValueError, "top_k: expected a positive int"),
    (lambda: grouped(top_k=9), ValueError, "top_k: 9 exceeds"),
    (lambda: grouped(top_k=5), ValueError, "top_k: 5 exceeds the 4 experts"),
    (lambda: grouped(n_group=3), ValueError,
     r"n_group: 3 does not divide the number of experts \(8\)"),
    (lambda: grouped(n_group=0), ValueError, "n_group: expected a positive int"),
    (lambda: grouped(topk_group=5), ValueError, r"topk_group: 5 exceeds n_group \(4\)"),
    (lambda: grouped(topk_group=0), ValueError, "topk_group: expected a positive int"),
    (lambda: grouped(correction_bias=torch.zeros(7)), ValueError,
     "correction_bias: expected shape"),
    (lambda: grouped(correction_bias=BIAS.to(META)), ValueError,
     "correction_bias: expected a tensor on"),
    (lambda: moe.align_by_expert(IDS.float(), E, 16), TypeError, "topk_ids: expected dtype"),
    (lambda: moe.align_by_expert(IDS[0], E, 16), ValueError, "topk_ids: expected 2 dim"),
    (lambda: moe.align_by_expert(IDS, 0, 16), ValueError, "num_experts: expected a positive"),
    (lambda: moe.align_by_expert(IDS, E, 0), ValueError, "block_size: expected a positive"),
    (lambda: fused(x=X[0]), ValueError, "x: expected 2 dim"),
    (lambda: fused(w13=W13[:, :, :8]), ValueError, "w13: expected shape"),
    (lambda: fused(w13=W13[:, :15]), ValueError, "w13: dim 1 holds gate and up rows"),
    (lambda: fused(w13=W13.half()), TypeError, "w13: expected dtype float32"),
    (lambda: fused(w2=W2[:, :, :4]), ValueError, "w2: expected shape"),
    (lambda: fused(w2=W2[:4]), ValueError, "w2: expected shape"),
    (lambda: fused(topk_weights=WEIGHTS.half()), TypeError, "topk_weights: expected dtype"),
    (lambda: fused(topk_weights=WEIGHTS[:2]), ValueError, "topk_weights: expected shape"),
    (lambda: fused(topk_ids=IDS[:, :1]), ValueError, "topk_ids: expected shape"),
    (lambda: fused(topk_ids=IDS.float()), TypeError, "topk_ids: expected dtype"),
    (lambda: fused(topk_ids=IDS.to(META)), ValueError, "topk_ids: expected a tensor on"),
    (lambda: fused(activation="relu"), ValueError, "activation: expected one of"),
    (lambda: fused(w13=Q13, w2=Q2, w13_scale=S13), TypeError, "w2_scale: expected a torch"),
    (lambda: fused(w13=Q13, w2=Q2, w13_scale=S13[:4], w2_scale=S2), ValueError,
     "w13_scale: expected shape"),
    (lambda: fused(w13=Q13, w2=Q2, w13_scale=S13, w2_scale=S2.double()), TypeError,
     "w2_scale: expected dtype"),
    (lambda: fused(w13=Q13, w2=W2, w13_scale=S13, w2_scale=S2), TypeError,
     "w2: expected dtype"),
    (lambda: fused(w13_scale=S13), ValueError, "only for float8_e4m3fn weights"),
    (lambda: fused(x=X.double(), w13=Q13, w2=Q2, w13_scale=S13, w2_scale=S2), TypeError,
     "x: block-fp8 experts take"),
    (lambda: moe.combine(X, WEIGHTS), ValueError, "expert_out: expected 3 dim"),
    (lambda: moe.combine(torch.randn(T, K + 1, H), WEIGHTS), ValueError,
     "topk_weights: expected shape"),
    (lambda: moe.combine(torch.randn(T, K, H), WEIGHTS.bfloat16()), TypeError,
     "topk_weights: expected dtype"),
]


@pytest.mark.parametrize("call,exc,match", BAD)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
