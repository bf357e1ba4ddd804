"""Triton MoE routing and align-by-expert vs tskernels_ref (interpreter on CPU, GPU tier)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.moe as ref
import tskernels_ref.norm as tskernels_ref_norm
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


@pytest.mark.parametrize("t,k,e,block", [(1100, 8, 128, 64), (700, 3, 5, 16),
                                         (8200, 8, 128, 64), (600, 8, 256, 128)])
def test_align_by_expert_many_chunks(kernel_device, t, k, e, block):
    """The three-launch path past one step of the offsets programs' prefix (8200 x 8 ids:
    513 chunks), with 2 (e = 5), 16 and 32 offsets programs, a skewed draw (a quarter of the
    experts take most ids, some none)."""
    gen = torch.Generator().manual_seed(t + e)
    hot = torch.randint(0, max(1, e // 4), (t, k), generator=gen)
    ids = torch.where(torch.rand(t, k, generator=gen) < 0.8, hot,
                      torch.randint(0, e, (t, k), generator=gen)).to(torch.int32)
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


def _assert_topk_set(ids: torch.Tensor, logits: torch.Tensor, tol: float) -> None:
    """ids [T, k] are a top-k set of each row of `logits` (float64) up to `tol`: nothing left
    out beats anything chosen by more than tol (a near tie after rounding may pick either)."""
    for row, chosen in zip(logits, ids.long()):
        assert len(set(chosen.tolist())) == chosen.numel()
        out = torch.ones_like(row, dtype=torch.bool)
        out[chosen] = False
        if out.any():
            assert row[chosen].min() >= row[out].max() - tol


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**16), t=st.sampled_from([0, 1, 2, 5, 17]),
       h=st.sampled_from([64, 200, 2048, 3000]), e=st.sampled_from([4, 8, 60, 128]),
       k=st.sampled_from([1, 2, 8]), dtype=st.sampled_from([torch.float32, torch.float16]),
       with_res=st.booleans(), renorm=st.booleans())
def test_rmsnorm_router_topk_softmax_triton(kernel_device, seed, t, h, e, k, dtype, with_res,
                                            renorm):
    """One launch of (add +) RMSNorm, router projection, softmax top-k vs the float64 chain
    of references; a second call (the counters re-armed) gives bit-equal results."""
    k = min(k, e)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen).to(dtype)
    res = torch.randn(t, h, generator=gen).to(dtype) if with_res else None
    nw = torch.rand(h, generator=gen) + 0.5
    gw = (torch.randn(e, h, generator=gen) * h ** -0.5).to(dtype)
    dev = lambda a: None if a is None else a.to(kernel_device)  # noqa: E731
    args = (dev(x), dev(nw), dev(gw), k)
    got = moe.rmsnorm_router_topk_softmax(*args, residual=dev(res), renormalize=renorm,
                                          backend="triton")
    y, r, w, ids = got
    # references: the add and the norm in float64 from the same inputs (rounded as the op does)
    if with_res:
        r_ref = (x.double() + res.double()).to(dtype)
        assert torch.equal(r.cpu(), r_ref)
    else:
        assert r is None
        r_ref = x
    y_ref = tskernels_ref_norm.rmsnorm(r_ref.double(), nw.double()).to(dtype)
    assert y.dtype == dtype and w.dtype == torch.float32 and ids.dtype == torch.int32
    assert_close(y, y_ref.double(), dtype)
    if t == 0:
        assert w.shape == (0, k) and ids.shape == (0, k)
        return
    # routing from the op's own y (its logits round y @ gate^T to dtype): a top-k set of the
    # float64 logits up to two roundings, and its weights those of the reference router on
    # the same ids
    logits = y.cpu().double() @ gw.double().T
    ulp = 2.0 ** (-23 if dtype == torch.float32 else -10)
    _assert_topk_set(ids.cpu(), logits, 4 * ulp * float(logits.abs().max()) + 1e-6)
    probs = torch.softmax(logits.to(dtype).double(), dim=-1)
    want = probs.gather(1, ids.cpu().long())
    if renorm:
        want = want / want.sum(dim=-1, keepdim=True)
    assert_close(w, want, torch.float32)
    assert bool((w[:, :-1] >= w[:, 1:]).all())  # by descending weight
    again = moe.rmsnorm_router_topk_softmax(*args, residual=dev(res), renormalize=renorm,
                                            backend="triton")
    for a, b in zip(got, again):
        assert (a is None and b is None) or torch.equal(a, b)


def test_rmsnorm_router_topk_softmax_matches_the_unfused_ops(kernel_device):
    """The Qwen3-30B-A3B shape (H 2048, 128 experts, top-8) with well-separated logits: the
    same ids and y as fused_add_rmsnorm -> linear -> topk_softmax (Triton)."""
    gen = torch.Generator().manual_seed(1)
    t, h, e = 3, 2048, 128
    x = torch.randn(t, h, generator=gen).to(torch.float16).to(kernel_device)
    res = torch.randn(t, h, generator=gen).to(torch.float16).to(kernel_device)
    nw = (torch.rand(h, generator=gen) + 0.5).to(kernel_device)
    gw = (torch.randn(e, h, generator=gen) * 0.02).to(torch.float16).to(kernel_device)
    y, r, w, ids = moe.rmsnorm_router_topk_softmax(x, nw, gw, 8, residual=res,
                                                   backend="triton")
    y2, r2 = tskernels.norm.fused_add_rmsnorm(x, res, nw, backend="triton")
    assert torch.equal(r, r2) and torch.equal(y, y2)
    logits = (y2.double() @ gw.double().T).to(torch.float16)
    w2, ids2 = moe.topk_softmax(logits, 8, backend="triton")
    top = logits.double().sort(dim=-1, descending=True).values
    assert bool((top[:, 7] - top[:, 8] > 0.01).all())  # separated: one right answer
    assert torch.equal(ids, ids2)
    assert_close(w, w2.double(), torch.float32)


@pytest.mark.parametrize("bad, err", [
    (dict(top_k=0), ValueError), (dict(top_k=9), ValueError),
    (dict(gw=torch.zeros(8, 32, dtype=torch.float16)), TypeError),
    (dict(gw=torch.zeros(8, 16)), ValueError),
    (dict(res=torch.zeros(3, 16)), ValueError),
    (dict(nw=torch.ones(16)), ValueError),
    (dict(x=torch.zeros(3, 2, 32)), ValueError),
    (dict(eps=0.0), ValueError),
])
def test_rmsnorm_router_topk_softmax_rejects_bad_input(bad, err):
    kw = dict(x=torch.zeros(3, 32), nw=torch.ones(32), gw=torch.zeros(8, 32), top_k=2,
              res=None, eps=1e-6)
    kw.update(bad)
    with pytest.raises(err):
        moe.rmsnorm_router_topk_softmax(kw["x"], kw["nw"], kw["gw"], kw["top_k"],
                                        residual=kw["res"], eps=kw["eps"])


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
def test_rmsnorm_router_topk_softmax_in_a_graph(kernel_device):
    """Captured once, replayed on new inputs: each replay equals an eager call."""
    h, e = 2048, 128
    x = torch.randn(2, h, device=kernel_device, dtype=torch.bfloat16)
    res = torch.randn_like(x)
    nw = torch.rand(h, device=kernel_device) + 0.5
    gw = torch.randn(e, h, device=kernel_device, dtype=torch.bfloat16) * 0.02
    moe.rmsnorm_router_topk_softmax(x, nw, gw, 8, residual=res, backend="triton")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = moe.rmsnorm_router_topk_softmax(x, nw, gw, 8, residual=res, backend="triton")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        res.copy_(torch.randn_like(res))
        g.replay()
        want = moe.rmsnorm_router_topk_softmax(x, nw, gw, 8, residual=res, backend="triton")
        torch.cuda.synchronize()
        for a, b in zip(out, want):
            assert torch.equal(a, b)
