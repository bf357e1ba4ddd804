"""Triton greedy argmax and penalties kernels vs torch / the reference, bit for bit
(interpreter on CPU, the real GPU with -m gpu, where the vocabulary is a real model's)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.sampling as ref
from tskernels.ops.sampling import triton as tg

from ..conftest import HAS_CUDA

DTYPES = [torch.float32, torch.float16]  # bf16 is not exact under the interpreter
VOCAB = 151936 if HAS_CUDA else 700


@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 5), v=st.integers(1, 3000),
       dtype=st.sampled_from(DTYPES), special=st.sampled_from(["none", "ties", "inf", "nan"]))
def test_greedy_equals_torch_argmax(kernel_device, seed, b, v, dtype, special):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, v, generator=gen) * 4).round()  # rounding makes ties common
    if special == "ties":
        x[:, torch.randint(0, v, (3,), generator=gen)] = x.max() + 1
    elif special == "inf":
        x[:, :: max(1, v // 3)] = float("-inf")
        x[0] = float("-inf")
    elif special == "nan":
        x[0, torch.randint(0, v, (2,), generator=gen)] = float("nan")
    x = x.to(kernel_device, dtype)
    got = tskernels.sampling.greedy(x, backend="triton")
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), torch.argmax(x.float().cpu(), dim=-1))


def test_greedy_large_vocab_every_chunk_size(kernel_device):
    """Maxima placed in the first / last chunk and on chunk edges, for batches that pick
    different chunk sizes."""
    v = 151936 if HAS_CUDA else 20000
    for b in (1, 3, 64) if HAS_CUDA else (1, 3):
        x = torch.randn(b, v, device=kernel_device)
        for r, col in enumerate([0, v - 1, 2047, 2048, 4096, 16383, 16384][:b]):
            x[r, col] = 100.0
        if b > 2:
            x[2, 5000] = x[2, 6000] = 200.0
        want = torch.argmax(x.cpu(), dim=-1)
        assert torch.equal(tg.argmax(x).cpu(), want)
        assert torch.equal(tg.argmax(x, variant="two_stage").cpu(), want)
        for chunk in (1024, 2048, 8192):  # the one-launch variants' sweep sizes
            assert torch.equal(tg.argmax(x, variant="ticket", chunk=chunk).cpu(), want), chunk
            got = tg.argmax(x, variant="loop_ticket", chunk=chunk, block=1024).cpu()
            assert torch.equal(got, want), chunk


def test_greedy_variants_on_ties_inf_nan(kernel_device):
    """Both variants, every sweep chunk size: first index on ties, -inf rows, first NaN,
    -0.0 == 0.0, and the ticket counters re-armed across calls (same result twice)."""
    v = 5000
    x = torch.randn(6, v)
    x[0, [7, 3000, 4999]] = 9.0
    x[1] = float("-inf")
    x[2, [11, 4000]] = float("nan")
    x[3] = 0.0
    x[3, 5] = -0.0
    x[4, 1000:] = float("-inf")
    x[5, 4097] = float("inf")
    x = x.to(kernel_device)
    want = torch.argmax(x.cpu(), dim=-1)
    for variant, chunk in (("two_stage", None), ("ticket", None), ("ticket", 1024),
                           ("ticket", 4096), ("loop_ticket", None), ("loop_ticket", 2048)):
        for _ in range(2):
            got = tg.argmax(x, variant=variant, chunk=chunk).cpu()
            assert torch.equal(got, want), (variant, chunk, got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["ticket", "loop_ticket"])
def test_greedy_ticket_replays_in_cuda_graph(variant):
    """The one-launch argmax variants re-arm their counters: graph replays (new logits copied
    in) keep matching torch.argmax."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(64, 151936, device="cuda", generator=gen)
    tg.argmax(x, variant=variant)  # eager first: allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tg.argmax(x, variant=variant)
    for _ in range(3):
        x.copy_(torch.randn(64, 151936, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.argmax(x, dim=-1))


def penalty_problem(b, v, length, nb, gen, device):
    ids = lambda n: torch.randint(-2, v + 2, (b, n), generator=gen)  # noqa: E731
    lens = lambda n: torch.randint(0, n + 1, (b,), generator=gen)  # noqa: E731
    kw = dict(output_ids=ids(length), output_lens=lens(length), prompt_ids=ids(length + 5).int(),
              prompt_lens=lens(length + 5).int(),
              repetition_penalty=torch.rand(b, generator=gen) * 1.5 + 0.5,
              presence_penalty=torch.randn(b, generator=gen),
              frequency_penalty=torch.randn(b, generator=gen) * 0.5)
    if nb:
        bias = ids(nb)
        bias[:, -1] = bias[:, 0]  # a duplicate id: the two values add up
        kw.update(logit_bias_ids=bias, logit_bias_values=torch.randn(b, nb, generator=gen) * 3)
    return {k: t.to(device) for k, t in kw.items()}


@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 4), v=st.integers(1, 300),
       length=st.integers(0, 300), nb=st.sampled_from([0, 1, 5, 70]),
       dtype=st.sampled_from(DTYPES),
       drop=st.sampled_from([(), ("repetition_penalty",), ("presence_penalty", "frequency_penalty"),
                             ("prompt_ids", "prompt_lens"), ("output_lens", "prompt_lens")]))
def test_penalties_equal_reference(kernel_device, seed, b, v, length, nb, dtype, drop):
    gen = torch.Generator().manual_seed(seed)
    kw = penalty_problem(b, v, length, nb, gen, kernel_device)
    for name in drop:
        kw.pop(name, None)
    x = (torch.randn(b, v, generator=gen) * 3).to(kernel_device, dtype)
    want = ref.apply_penalties(x, **kw)
    got = x.clone()
    assert tskernels.sampling.apply_penalties(got, **kw, backend="triton") is got
    many, bound = _summed_bias(kw, b, v, got.device)
    # exact, except where three or more bias values name one id: their float32 sum depends on
    # the order (the kernel's tree reduction; the reference's scatter_add, itself unordered on
    # a GPU), within the classic (n - 1) eps sum|v| bound, plus one rounding to the dtype
    assert torch.equal(got[~many], want[~many]), (got - want).abs().max()
    if many.any():
        err = (got[many].double() - want[many].double()).abs()
        tol = bound[many] + torch.finfo(dtype).eps * want[many].double().abs()
        assert (err <= tol).all(), (err.max(), tol.min())


def _summed_bias(kw, b, v, device):
    """([b, v] ids with >= 3 valid bias entries, [b, v] float64 (n - 1) eps32 sum|value|)."""
    many = torch.zeros(b, v, dtype=torch.bool, device=device)
    bound = torch.zeros(b, v, dtype=torch.float64, device=device)
    ids, vals = kw.get("logit_bias_ids"), kw.get("logit_bias_values")
    if ids is None or not ids.numel():
        return many, bound
    ok = (ids >= 0) & (ids < v)
    idx = torch.where(ok, ids.long(), 0)
    count = torch.zeros(b, v, dtype=torch.float64, device=device).scatter_add_(
        1, idx, ok.double())
    mass = torch.zeros(b, v, dtype=torch.float64, device=device).scatter_add_(
        1, idx, torch.where(ok, vals.double().abs(), 0.0))
    eps = torch.finfo(torch.float32).eps
    return count >= 3, (count - 1).clamp_min(0) * eps * mass


def test_penalties_long_histories_real_vocab(kernel_device):
    gen = torch.Generator().manual_seed(5)
    b, length = (64, 4096) if HAS_CUDA else (2, 600)
    kw = penalty_problem(b, VOCAB, length, 300 if HAS_CUDA else 20, gen, kernel_device)
    kw["output_ids"] = kw["output_ids"] % 500  # many repeats: long runs after the sort
    x = torch.randn(b, VOCAB, device=kernel_device)
    got = x.clone()
    tskernels.sampling.apply_penalties(got, **kw, backend="triton")
    assert torch.equal(got, ref.apply_penalties(x, **kw))


@pytest.mark.gpu
def test_penalties_capture_in_cuda_graph():
    gen = torch.Generator().manual_seed(6)
    kw = penalty_problem(8, VOCAB, 256, 16, gen, "cuda")
    x = torch.randn(8, VOCAB, device="cuda")
    buf = x.clone()
    tskernels.sampling.apply_penalties(buf, **kw, backend="triton")  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    buf.copy_(x)
    with torch.cuda.graph(graph):
        tskernels.sampling.apply_penalties(buf, **kw, backend="triton")
    buf.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf, ref.apply_penalties(x, **kw))
