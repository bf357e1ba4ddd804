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
        assert torch.equal(tg.argmax(x, variant="balanced").cpu(), want)
        if HAS_CUDA:  # on the CPU two_stage_pdl is two_stage
            assert torch.equal(tg.argmax(x, variant="two_stage_pdl").cpu(), want)
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


def _edge_rows(v: int) -> torch.Tensor:
    """8 rows of v logits: ties across chunks, a -inf row, two NaNs (the first wins), zeros
    with a -0.0, a -inf tail, +inf, a NaN after the max, a NaN behind a -inf half."""
    x = torch.randn(8, v)
    x[0, [7, v // 2, v - 1]] = 9.0
    x[1] = float("-inf")
    x[2, [11, v - 3]] = float("nan")
    x[3] = 0.0
    x[3, 5] = -0.0
    x[4, v // 5:] = float("-inf")
    x[5, v - 2] = float("inf")
    x[6, 3], x[6, v - 1] = 50.0, float("nan")
    x[7, : v // 2] = float("-inf")
    x[7, v // 2 + 1] = float("nan")
    return x


# balanced launches (v = 999: no multiple of 16): several chunks of several loop steps with
# masked tails; 1-row steps without evict / PDL; the default (one chunk a row on the CPU)
BALANCED_CASES = [(torch.float32, tg.Balanced(num_warps=1, rows=2, chunks=2)),
                  (torch.float32, tg.Balanced(num_warps=2, rows=1, chunks=2,
                                              evict_first=False, pdl="none")),
                  (torch.float16, tg.Balanced()),
                  (torch.float16, tg.Balanced(num_warps=1, rows=2, chunks=2))]


@pytest.mark.parametrize("dtype,cfg", BALANCED_CASES)
def test_greedy_balanced_on_edges(kernel_device, dtype, cfg):
    """balanced (and on a GPU two_stage_pdl, which is two_stage on the CPU) equal
    torch.argmax on ties / -inf / NaN / -0.0 rows."""
    x = _edge_rows(999).to(kernel_device, dtype)
    want = torch.argmax(x.float().cpu(), dim=-1)
    got = tg.argmax(x, variant="balanced", balanced=cfg).cpu()
    assert torch.equal(got, want), (got, want)
    if HAS_CUDA:
        assert torch.equal(tg.argmax(x, variant="two_stage_pdl", pdl=cfg.pdl).cpu(), want)


def test_balanced_split_whole_waves():
    """S = the most chunks that keep B x S within per_sm x waves x SMs, at least a tile per
    chunk, 16-logit multiples, none empty."""
    cfg = tg.Balanced(per_sm=4)
    assert tg.balanced_split(64, 151936, 4096, 132, cfg) == (8, 18992)
    assert tg.balanced_split(256, 151936, 4096, 132, cfg) == (2, 75968)
    assert tg.balanced_split(1, 151936, 4096, 132, cfg) == (38, 4000)
    assert tg.balanced_split(2000, 151936, 4096, 132, cfg) == (1, 151936)
    for b, v in ((3, 17), (7, 4999), (64, 128256)):
        s, chunk = tg.balanced_split(b, v, 256, 132, tg.Balanced(waves=2))
        assert chunk % 16 == 0 and (s - 1) * chunk < v <= s * chunk
    with pytest.raises(ValueError, match="pdl"):
        tg.Balanced(pdl="all")
    with pytest.raises(ValueError, match="powers of two"):
        tg.Balanced(rows=3)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["two_stage_pdl", "balanced"])
def test_greedy_pdl_variants_graph_and_streams(variant):
    """The programmatic-dependent variants in CUDA-graph replays (new logits copied in) and
    on two streams at once (each call owns its partials): always torch.argmax, bf16 too."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 151936, device="cuda", generator=gen).to(dtype)
        tg.argmax(x, variant=variant)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = tg.argmax(x, variant=variant)
        for _ in range(3):
            x.copy_(torch.randn(64, 151936, device="cuda", generator=gen))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, torch.argmax(x.float(), dim=-1))
        xs = [torch.randn(b, 151936, device="cuda", generator=gen).to(dtype) for b in (64, 3)]
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        torch.cuda.synchronize()
        got = [[], []]
        for _ in range(10):
            for i, s in enumerate(streams):
                with torch.cuda.stream(s):
                    got[i].append(tg.argmax(xs[i], variant=variant))
        torch.cuda.synchronize()
        for i in range(2):
            assert all(torch.equal(g, torch.argmax(xs[i].float(), dim=-1)) for g in got[i])


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
