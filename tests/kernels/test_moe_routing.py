"""Triton MoE routing and align-by-expert vs tskernels_ref (interpreter on CPU, GPU tier)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.moe as ref
from tskernels.numerics import assert_close

moe = tskernels.moe
GPU = torch.cuda.is_available()
EXAMPLES = 15 if GPU else 10


def _distinct_logits(t: int, e: int, dtype, gen) -> torch.Tensor:
    """Logits with no ties after rounding to `dtype` (a tie may legally pick either id)."""
    base = torch.randperm(t * e, generator=gen).view(t, e).float() / (t * e) * 8 - 4
    return base.to(dtype)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**16), t=st.sampled_from([0, 1, 3, 17, 40]),
       e=st.sampled_from([4, 8, 60, 128]), k=st.sampled_from([1, 2, 8]),
       dtype=st.sampled_from([torch.float32, torch.float16]), renorm=st.booleans())
def test_topk_softmax_triton(kernel_device, seed, t, e, k, dtype, renorm):
    k = min(k, e)
    gen = torch.Generator().manual_seed(seed)
    logits = _distinct_logits(t, e, dtype, gen)
    w, ids = moe.topk_softmax(logits.to(kernel_device), k, renormalize=renorm, backend="triton")
    rw, rids = ref.topk_softmax(logits.double(), k, renormalize=renorm)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids.cpu(), rids)
    assert_close(w, rw, torch.float32)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**16), t=st.sampled_from([0, 1, 5, 33]),
       shape=st.sampled_from([(8, 4, 2, 4), (16, 4, 1, 3), (64, 8, 4, 8), (256, 8, 4, 8),
                              (6, 3, 3, 2), (32, 1, 1, 4)]),
       renorm=st.booleans())
def test_topk_sigmoid_grouped_triton(kernel_device, seed, t, shape, renorm):
    e, n_group, topk_group, k = shape
    gen = torch.Generator().manual_seed(seed)
    logits = _distinct_logits(t, e, torch.float32, gen)
    bias = torch.randperm(e, generator=gen).float() / e * 0.1
    kw = dict(n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.5,
              renormalize=renorm)
    w, ids = moe.topk_sigmoid_grouped(logits.to(kernel_device), bias.to(kernel_device), k,
                                      backend="triton", **kw)
    rw, rids = ref.topk_sigmoid_grouped(logits.double(), bias.double(), k, **kw)
    assert torch.equal(ids.cpu(), rids)
    assert_close(w, rw, torch.float32)


def test_sigmoid_grouped_bf16_logits(kernel_device):
    logits = torch.randn(9, 64).to(torch.bfloat16)
    bias = torch.zeros(64)
    w, ids = moe.topk_sigmoid_grouped(logits.to(kernel_device), bias.to(kernel_device), 6,
                                      n_group=8, topk_group=3, backend="triton")
    rw, rids = ref.topk_sigmoid_grouped(logits.double(), bias.double(), 6, n_group=8,
                                        topk_group=3)
    assert torch.equal(ids.cpu(), rids)
    assert_close(w, rw, torch.float32)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**16), t=st.sampled_from([0, 1, 2, 7, 64, 300]),
       k=st.sampled_from([1, 2, 8]), e=st.sampled_from([1, 5, 16, 128]),
       block=st.sampled_from([1, 16, 64]), dtype=st.sampled_from([torch.int32, torch.int64]),
       pattern=st.sampled_from(["random", "one_expert", "non_local"]))
def test_align_by_expert_triton(kernel_device, seed, t, k, e, block, dtype, pattern):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=dtype)
    if pattern == "one_expert":
        ids.fill_(e - 1)
    elif pattern == "non_local":
        ids[torch.rand(t, k, generator=gen) < 0.3] = -1
    got = moe.align_by_expert(ids.to(kernel_device), e, block, backend="triton")
    for g, w in zip(got, ref.align_by_expert(ids, e, block)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w)


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
def test_routing_and_align_capture_in_a_graph(kernel_device):
    logits = torch.randn(4, 128, device=kernel_device)
    w, ids = moe.topk_softmax(logits, 8, backend="triton")
    moe.align_by_expert(ids, 128, 16, backend="triton")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w, ids = moe.topk_softmax(logits, 8, backend="triton")
        out = moe.align_by_expert(ids, 128, 16, backend="triton")
    logits.copy_(torch.randn(4, 128, device=kernel_device))
    g.replay()
    torch.cuda.synchronize()
    rw, rids = ref.topk_softmax(logits.cpu(), 8)
    assert torch.equal(ids.cpu(), rids)
    for got, want in zip(out, ref.align_by_expert(rids, 128, 16)):
        assert torch.equal(got.cpu(), want)
