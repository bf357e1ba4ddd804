"""Triton top-k / top-p / min-p sampler: filtered tokens never drawn, frequencies match the
reference distribution (chi-square, fixed seeds), fast and exact paths draw the same tokens,
draws independent of batch composition and repeatable under CUDA-graph replay.

Under the interpreter the candidate buffer is shrunk (CMAX_CPU) so the in-register sorts stay
small; the kernels are the same, CMAX is a constexpr of them."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.sampling as ref
from tskernels.ops.sampling import triton_sample as ts

from ..conftest import HAS_CUDA
from ..ref.test_sampling import chi_square, naive_allowed

CMAX_CPU = 32
# the interpreter runs ~50 ms per row: fewer examples there (the GPU tier keeps its profile)
FEW = settings(max_examples=6) if not HAS_CUDA else (lambda f: f)


def draw(logits, cmax=None, **p):
    if cmax is None and HAS_CUDA:
        return tskernels.sampling.sample(logits, **p, backend="triton")
    return ts.run(logits, **p, cmax=cmax or CMAX_CPU)


def params(b, device, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None, steps=None):
    def full(v, dt):
        return (v if isinstance(v, torch.Tensor) else torch.full((b,), v)).to(device, dt)
    return dict(temperature=full(temperature, torch.float32), top_k=full(top_k, torch.int32),
                top_p=full(top_p, torch.float32), min_p=full(min_p, torch.float32),
                seeds=full(torch.arange(b) if seeds is None else seeds, torch.int64),
                steps=full(0 if steps is None else steps, torch.int64))


def mixed(b, v, gen, device):
    """Per-request parameters drawn row by row: greedy, pure temperature, each filter, all."""
    pick = lambda xs: torch.tensor([xs[int(i)] for i in torch.randint(0, len(xs), (b,), generator=gen)])  # noqa: E731
    return params(b, device, temperature=pick([0.0, 0.5, 1.0, 1.7]),
                  top_k=pick([0, -1, 1, 3, 10, v + 5]), top_p=pick([1.0, 0.95, 0.6, 0.2]),
                  min_p=pick([0.0, 0.0, 0.05, 0.3]),
                  seeds=torch.randint(0, 2**62, (b,), generator=gen),
                  steps=torch.randint(0, 2**40, (b,), generator=gen))


@FEW
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 6), v=st.integers(1, 160),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_fast_and_exact_paths_draw_the_same_tokens(kernel_device, seed, b, v, dtype):
    """Candidate path (sorted buffer) and bisection path (cmax 1) keep the same set and race
    with the same noise, so they must agree token for token."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, v, generator=gen) * 3).to(kernel_device, dtype)
    p = mixed(b, v, gen, kernel_device)
    fast = ts.run(x, **p, cmax=256 if v <= 160 else ts.CMAX)
    exact = ts.run(x, **p, cmax=1)
    assert torch.equal(fast.token_ids, exact.token_ids)
    assert torch.equal(fast.logprobs, exact.logprobs)
    # group-max pipeline: rows past one gathered group go through the chunked compaction
    compact = ts.run(x, **p, pipeline="groupmax", cmax=256, gmax=1)
    assert torch.equal(compact.token_ids, fast.token_ids)
    greedy = p["temperature"] < ref.SAMPLING_EPS
    assert torch.equal(fast.token_ids[greedy], x.float().argmax(-1)[greedy])


@FEW
@given(seed=st.integers(0, 2**31 - 1), v=st.integers(2, 60), data=st.data())
def test_filtered_tokens_never_drawn(kernel_device, seed, v, data):
    gen = torch.Generator().manual_seed(seed)
    rows = 4
    logits = torch.randn(rows, v, generator=gen, dtype=torch.float64) * 2
    cfg = [(data.draw(st.sampled_from([0.5, 1.0, 2.0])), data.draw(st.integers(-1, v + 1)),
            data.draw(st.sampled_from([1.0, 0.9, 0.5, 0.1])),
            data.draw(st.sampled_from([0.0, 0.05, 0.3]))) for _ in range(rows)]
    allowed, margin = zip(*(naive_allowed(logits[r], *cfg[r]) for r in range(rows)))
    assume(min(margin) > 1e-4)
    reps = 4 if not HAS_CUDA else 512  # each row repeated with different seeds, one launch
    x = logits.float().repeat_interleave(reps, 0).to(kernel_device)
    col = lambda i: torch.tensor([c[i] for c in cfg]).repeat_interleave(reps)  # noqa: E731
    p = params(rows * reps, kernel_device, temperature=col(0), top_k=col(1), top_p=col(2),
               min_p=col(3), seeds=torch.arange(rows * reps) + seed)
    tok = draw(x, **p).token_ids.cpu().view(rows, reps)
    for r in range(rows):
        assert set(tok[r].tolist()) <= allowed[r], (cfg[r], allowed[r], tok[r])


def test_frequencies_match_the_reference_distribution(kernel_device):
    """Chi-square of draws (fixed seeds, one row per draw, stride-0 logits) below its
    1 - 1e-4 quantile, for each filter; filtered tokens are never drawn."""
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, -3.0]])
    n = 200_000 if HAS_CUDA else 120
    crit = {5: 25.7, 4: 23.5, 3: 21.1, 2: 18.4, 1: 15.1}
    cases = ((0.8, 0, 1.0, 0.0), (1.5, 3, 1.0, 0.0), (1.0, 0, 0.7, 0.0), (1.0, 0, 1.0, 0.2),
             (1.2, 4, 0.8, 0.05))
    for temperature, top_k, top_p, min_p in cases if HAS_CUDA else cases[2::2]:
        x = logits.to(kernel_device).expand(n, 6)
        tok = draw(x, **params(n, kernel_device, temperature, top_k, top_p, min_p)).token_ids
        allowed, _ = naive_allowed(logits[0], temperature, top_k, top_p, min_p)
        w = [math.exp(float(v) / temperature) if i in allowed else 0.0
             for i, v in enumerate(logits[0])]
        probs = [v / sum(w) for v in w]
        counts = torch.bincount(tok.cpu(), minlength=6).tolist()
        assert all(counts[i] == 0 for i in range(6) if probs[i] == 0), counts
        assert chi_square(counts, probs) < crit[max(len(allowed) - 1, 1)], (counts, probs)


@pytest.mark.parametrize("v", [6, 9000])
def test_rows_with_nothing_to_draw(kernel_device, v):
    """A row of -inf only (e.g. a grammar mask that allows nothing) draws token 0 with a NaN
    logprob, as torch.argmax / log_softmax give, on the candidate and the exact path, greedy or
    not (it once read the logit at index 2**31 - 1); a row with one finite logit draws it."""
    x = torch.full((4, v), float("-inf"))
    x[1, 3] = x[3, v - 2] = 1.0
    for temperature in (0.0, 1.0):
        for cmax in (None, 1):
            p = params(4, kernel_device, temperature, 4, 0.8, 0.05)
            out = draw(x.to(kernel_device), cmax=cmax, **p)
            assert out.token_ids.tolist() == [0, 3, 0, v - 2], (temperature, cmax)
            lp = out.logprobs.cpu()
            assert lp[[0, 2]].isnan().all() and lp[[1, 3]].tolist() == [0.0, 0.0]


def test_large_vocab_distribution(kernel_device):
    """Real vocabulary, top-k 50 + top-p 0.9 + min-p 0.02: draws stay in the reference's kept
    set and follow its renormalised probabilities (GPU: 100k draws)."""
    v = 151936 if HAS_CUDA else 3000
    n = 100_000 if HAS_CUDA else 64
    gen = torch.Generator().manual_seed(11)
    row = torch.randn(1, v, generator=gen) * 2.5
    x = row.to(kernel_device).expand(n, v)
    p = params(n, kernel_device, 0.9, 50, 0.9, 0.02, seeds=torch.arange(n) * 7 + 3)
    tok = draw(x, cmax=None if HAS_CUDA else 64, **p).token_ids.cpu()
    probs = torch.softmax(row.double() / 0.9, -1)
    keep = ref.filter_mask(probs.float(), p["top_k"][:1].cpu(), p["top_p"][:1].cpu(),
                           p["min_p"][:1].cpu())[0]
    assert bool(keep[tok].all())
    kept = torch.nonzero(keep).flatten()
    q = probs[0, kept] / probs[0, kept].sum()
    counts = torch.bincount(tok, minlength=v)[kept].tolist()
    if HAS_CUDA:
        df = len(kept) - 1
        crit = df + 4.0 * math.sqrt(2 * df) + 10  # well past the 1 - 1e-4 quantile
        assert chi_square(counts, q.tolist()) < crit


def test_draws_do_not_depend_on_the_batch(kernel_device):
    gen = torch.Generator().manual_seed(4)
    b, v = 8, 151936 if HAS_CUDA else 300
    x = (torch.randn(b, v, generator=gen) * 2).to(kernel_device)
    p = mixed(b, v, gen, kernel_device)
    a = draw(x, **p)
    again = draw(x, **p)
    assert torch.equal(a.token_ids, again.token_ids) and torch.equal(a.logprobs, again.logprobs)
    perm = torch.randperm(b, generator=gen).to(kernel_device)
    c = draw(x[perm], **{k: t[perm] for k, t in p.items()})
    assert torch.equal(c.token_ids, a.token_ids[perm])
    for r in (0, 5):
        solo = draw(x[r:r + 1], **{k: t[r:r + 1] for k, t in p.items()})
        assert int(solo.token_ids[0]) == int(a.token_ids[r])
    # inside a bigger batch of other requests
    other = (torch.randn(13, v, generator=gen) * 5).to(kernel_device)
    q = mixed(13, v, gen, kernel_device)
    big = draw(torch.cat([other, x]), **{k: torch.cat([q[k], p[k]]) for k in p})
    assert torch.equal(big.token_ids[13:], a.token_ids)
    # another step draws differently (over many rows, almost surely)
    flat = x[:1].expand(64, v)
    s0 = draw(flat, **params(64, kernel_device, steps=0)).token_ids
    s1 = draw(flat, **params(64, kernel_device, steps=1)).token_ids
    assert not torch.equal(s0, s1)


def test_logprobs_of_raw_distribution(kernel_device):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(5, 400, generator=gen) * 2).to(kernel_device)
    p = params(5, kernel_device, 0.3, 5)
    out = ts.run(x, **p, num_logprobs=4, cmax=64)
    raw = torch.log_softmax(x.double(), -1)
    torch.testing.assert_close(out.logprobs.double(), raw.gather(1, out.token_ids[:, None])[:, 0],
                               rtol=0, atol=1e-5)
    want = ref.sample(x, **p, num_logprobs=4).top_logprobs
    assert torch.equal(out.top_logprobs[1], want[1])
    torch.testing.assert_close(out.top_logprobs[0], want[0], rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_sample_replays_in_cuda_graph():
    gen = torch.Generator().manual_seed(9)
    b, v = 32, 151936
    x = (torch.randn(b, v, generator=gen) * 2).cuda()
    p = mixed(b, v, gen, "cuda")
    eager = tskernels.sampling.sample(x, **p, num_logprobs=2, backend="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tskernels.sampling.sample(x, **p, num_logprobs=2, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.token_ids, eager.token_ids)
    p["steps"].add_(1)  # the next decode step, same graph
    graph.replay()
    later = tskernels.sampling.sample(x, **p, num_logprobs=2, backend="triton")
    torch.cuda.synchronize()
    assert torch.equal(out.token_ids, later.token_ids)
    assert torch.equal(out.logprobs, later.logprobs)


def test_histogram_resolution_changes_no_token(kernel_device):
    """The bins only decide which superset of the kept set is compacted: coarser histograms
    (the sweep's candidates) must draw exactly the default's tokens."""
    gen = torch.Generator().manual_seed(21)
    b, v = 6, 151936 if HAS_CUDA else 150
    x = (torch.randn(b, v, generator=gen) * 3).to(kernel_device)
    p = mixed(b, v, gen, kernel_device)
    cmax = ts.CMAX if HAS_CUDA else 64
    want = ts.run(x, **p, cmax=cmax, pipeline="histogram").token_ids
    for bins in ((32, 2.0), (64, 4.0)):
        assert torch.equal(ts.run(x, **p, cmax=cmax, bins=bins).token_ids, want), bins


def test_pipelines_draw_the_same_tokens(kernel_device):
    """The group-max pipeline (default) and the histogram one keep the same sets and race with
    the same noise: equal tokens on a real vocabulary, per-request mixes plus wide top-k rows
    (the GPU's compaction path; under the interpreter a 2-group gather drives rows there)."""
    gen = torch.Generator().manual_seed(31)
    b, v = (12, 151936) if HAS_CUDA else (6, 3000)
    x = (torch.randn(b, v, generator=gen) * 3).to(kernel_device)
    p = mixed(b, v, gen, kernel_device)
    p["top_k"][:3] = torch.tensor([1000, 300, 50]).to(p["top_k"])
    p["temperature"][:3] = 0.8
    cmax = ts.CMAX if HAS_CUDA else 64
    want = ts.run(x, **p, cmax=cmax, pipeline="histogram")
    for gmax in ((None, 8) if HAS_CUDA else (None, 2)):
        kw = {} if gmax is None else {"gmax": gmax}
        got = ts.run(x, **p, cmax=cmax, pipeline="groupmax", **kw)
        assert torch.equal(got.token_ids, want.token_ids), gmax
        torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
