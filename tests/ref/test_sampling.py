"""tskernels_ref.sampling: greedy, filters vs a sort-based float64 formulation, seeding, frequencies."""
from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tskernels_ref import sampling

from ._problems import rand


def params(batch, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None):
    full = lambda v, dt: v if isinstance(v, torch.Tensor) else torch.full((batch,), v, dtype=dt)
    return dict(temperature=full(temperature, torch.float32), top_k=full(top_k, torch.int32),
                top_p=full(top_p, torch.float32), min_p=full(min_p, torch.float32),
                seeds=torch.arange(batch, dtype=torch.int64) if seeds is None else seeds)


def naive_allowed(logits_row, temperature, top_k, top_p, min_p):
    """Sort-based float64 filter of one row -> (set of allowed ids, margins to each threshold)."""
    x = [float(v) / temperature for v in logits_row.double()]
    m = max(x)
    z = sum(math.exp(v - m) for v in x)
    p = [math.exp(v - m) / z for v in x]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    allowed = set(range(len(p)))
    if 0 < top_k < len(p):
        kth = p[order[top_k - 1]]
        allowed = {i for i in allowed if p[i] >= kth}
    margins = [1.0]
    if top_p < 1.0:
        mass = sum(p[i] for i in allowed)
        cum, cut = 0.0, None
        for i in [i for i in order if i in allowed]:
            cum += p[i] / mass
            margins.append(abs(cum - top_p))
            if cum >= top_p and cut is None:
                cut = p[i]
        cut = cut if cut is not None else min(p[i] for i in allowed)
        allowed = {i for i in allowed if p[i] >= cut}
    if min_p > 0:
        margins += [abs(pi - min_p * max(p)) / max(p) for pi in p]
        allowed = {i for i in allowed if p[i] >= min_p * max(p)}
    return allowed, min(margins)


def test_greedy_is_argmax():
    gen = torch.Generator().manual_seed(0)
    logits = rand(7, 50, gen=gen).float()
    want = [max(range(50), key=lambda i: float(logits[b, i])) for b in range(7)]
    assert sampling.greedy(logits).tolist() == want
    out = sampling.sample(logits, **params(7, temperature=0.0, top_k=3, top_p=0.5, min_p=0.2))
    assert out.token_ids.tolist() == want and out.token_ids.dtype == torch.int64
    out = sampling.sample(logits, **params(7, temperature=1.3, top_k=1))
    assert out.token_ids.tolist() == want


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 6), vocab=st.integers(2, 60), data=st.data(), seed=st.integers(0, 2**31))
def test_filtered_tokens_never_drawn(batch, vocab, data, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = rand(batch, vocab, gen=gen, scale=2.0).float()
    temperature = torch.tensor([data.draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(batch)])
    top_k = torch.tensor([data.draw(st.integers(-1, vocab + 1)) for _ in range(batch)], dtype=torch.int32)
    top_p = torch.tensor([data.draw(st.sampled_from([1.0, 0.9, 0.5, 0.1, 0.0])) for _ in range(batch)])
    min_p = torch.tensor([data.draw(st.sampled_from([0.0, 0.05, 0.3])) for _ in range(batch)])
    want, margin = zip(*(naive_allowed(logits[b], float(temperature[b]), int(top_k[b]), float(top_p[b]),
                                       float(min_p[b])) for b in range(batch)))
    assume(min(margin) > 1e-4)  # float32 vs float64 cumulative sums must agree on the cut
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    mask = sampling.filter_mask(probs, top_k, top_p, min_p)
    for b in range(batch):
        assert set(torch.nonzero(mask[b]).flatten().tolist()) == want[b]
    drawn = [set() for _ in range(batch)]
    for s in range(40):
        out = sampling.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              seeds=torch.full((batch,), seed + s, dtype=torch.int64))
        for b in range(batch):
            drawn[b].add(int(out.token_ids[b]))
    for b in range(batch):
        assert drawn[b] <= want[b]


def test_seeded_repeatable_and_batch_independent():
    gen = torch.Generator().manual_seed(1)
    batch, vocab = 8, 1000
    logits = rand(batch, vocab, gen=gen, scale=1.0).float()
    p = params(batch, temperature=torch.linspace(0.5, 1.5, batch), top_k=torch.tensor([0, 50] * 4, dtype=torch.int32),
               top_p=torch.tensor([1.0, 0.9] * 4), seeds=torch.tensor([7, 7, 123, 5, 5, 9, 2**40, 11]))
    steps = torch.arange(batch, dtype=torch.int64) % 3
    a = sampling.sample(logits, **p, steps=steps, num_logprobs=3)
    b = sampling.sample(logits, **p, steps=steps, num_logprobs=3)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.logprobs, b.logprobs)
    perm = torch.randperm(batch, generator=gen)
    c = sampling.sample(logits[perm], **{k: v[perm] for k, v in p.items()}, steps=steps[perm])
    assert torch.equal(c.token_ids, a.token_ids[perm])
    # a request alone draws what it drew inside the batch
    solo = sampling.sample(logits[3:4], **{k: v[3:4] for k, v in p.items()}, steps=steps[3:4])
    assert int(solo.token_ids[0]) == int(a.token_ids[3])
    # a different step draws differently (over many rows, almost surely)
    flat = logits[:1].expand(64, vocab)
    s0 = sampling.sample(flat, **params(64), steps=torch.zeros(64, dtype=torch.int64)).token_ids
    s1 = sampling.sample(flat, **params(64), steps=torch.ones(64, dtype=torch.int64)).token_ids
    assert not torch.equal(s0, s1)


def test_logprobs_from_raw_distribution():
    gen = torch.Generator().manual_seed(2)
    logits = rand(5, 40, gen=gen, scale=2.0).float()
    out = sampling.sample(logits, **params(5, temperature=0.3, top_k=5), num_logprobs=4)
    for b in range(5):
        row = [float(v) for v in logits[b].double()]
        lse = max(row) + math.log(sum(math.exp(v - max(row)) for v in row))
        assert abs(float(out.logprobs[b]) - (row[int(out.token_ids[b])] - lse)) < 1e-5
        best = sorted(range(40), key=lambda i: -row[i])[:4]
        assert out.top_logprobs[1][b].tolist() == best
        for j, i in enumerate(best):
            assert abs(float(out.top_logprobs[0][b, j]) - (row[i] - lse)) < 1e-5
    assert out.logprobs.dtype == torch.float32
    assert sampling.sample(logits, **params(5)).top_logprobs is None


def chi_square(counts, probs):
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs) if p > 0)


def test_frequencies_match_softmax():
    """6-token vocab, 6000 fixed seeds: chi-square below the p = 1e-4 quantile of its df."""
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, -3.0]])
    n = 6000
    crit = {5: 25.7, 2: 18.4, 1: 15.1}  # chi-square quantiles at 1 - 1e-4
    for temperature, top_k, top_p, min_p in ((0.8, 0, 1.0, 0.0), (1.5, 3, 1.0, 0.0), (1.0, 0, 0.7, 0.0),
                                             (1.0, 0, 1.0, 0.2)):
        out = sampling.sample(logits.expand(n, 6), **params(n, temperature, top_k, top_p, min_p))
        allowed, _ = naive_allowed(logits[0], temperature, top_k, top_p, min_p)
        x = [float(v) / temperature for v in logits[0]]
        w = [math.exp(v) if i in allowed else 0.0 for i, v in enumerate(x)]
        probs = [v / sum(w) for v in w]
        counts = torch.bincount(out.token_ids, minlength=6).tolist()
        assert all(counts[i] == 0 for i in range(6) if probs[i] == 0)
        assert chi_square(counts, probs) < crit[max(len(allowed) - 1, 1)], (temperature, counts, probs)


def naive_penalties(logits, out_ids, out_lens, prompt_ids, prompt_lens, rep, pres, freq,
                    bias_ids, bias_vals):
    """Row-by-row float64 reading of the OpenAI / HF rules (bias, repetition, freq/presence)."""
    batch, vocab = logits.shape
    want = logits.double().clone()
    for b in range(batch):
        outs = [int(t) for t in out_ids[b, :int(out_lens[b])] if 0 <= int(t) < vocab]
        prompt = [int(t) for t in prompt_ids[b, :int(prompt_lens[b])] if 0 <= int(t) < vocab]
        for t, v in zip(bias_ids[b].tolist(), bias_vals[b].tolist()):
            if 0 <= t < vocab:
                want[b, t] += v
        for t in set(outs) | set(prompt):
            x = float(want[b, t])
            want[b, t] = x / float(rep[b]) if x > 0 else x * float(rep[b])
        for t in set(outs):
            want[b, t] -= float(freq[b]) * outs.count(t) + float(pres[b])
    return want


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 5), vocab=st.integers(1, 40), length=st.integers(0, 30),
       seed=st.integers(0, 2**31))
def test_penalties_match_float64_rules(batch, vocab, length, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = rand(batch, vocab, gen=gen, scale=3.0).float()
    ids = lambda n: torch.randint(-2, vocab + 2, (batch, n), generator=gen)  # noqa: E731
    lens = lambda n: torch.randint(0, n + 1, (batch,), generator=gen)  # noqa: E731
    out_ids, prompt_ids, bias_ids = ids(length), ids(length + 3).int(), ids(4)
    out_lens, prompt_lens = lens(length), lens(length + 3)
    rep = torch.rand(batch, generator=gen) * 2 + 0.5
    pres = torch.randn(batch, generator=gen)
    freq = torch.randn(batch, generator=gen)
    bias_vals = torch.randn(batch, 4, generator=gen) * 5
    got = sampling.apply_penalties(
        logits, output_ids=out_ids, output_lens=out_lens, prompt_ids=prompt_ids,
        prompt_lens=prompt_lens, repetition_penalty=rep, presence_penalty=pres,
        frequency_penalty=freq, logit_bias_ids=bias_ids, logit_bias_values=bias_vals)
    want = naive_penalties(logits, out_ids, out_lens, prompt_ids, prompt_lens, rep, pres, freq,
                           bias_ids, bias_vals)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_penalties_leave_untouched_tokens_bit_for_bit():
    logits = torch.tensor([[-0.0, float("-inf"), 1.5, -2.0, 4.0]])
    got = sampling.apply_penalties(logits, output_ids=torch.tensor([[2, 2, 3, -1]]),
                                   output_lens=torch.tensor([3]),
                                   repetition_penalty=torch.tensor([2.0]),
                                   frequency_penalty=torch.tensor([0.5]),
                                   presence_penalty=torch.tensor([0.25]))
    assert torch.equal(got[0, :2], logits[0, :2]) and bool(torch.signbit(got[0, 0]))
    assert got[0].tolist()[2:] == [1.5 / 2 - 1.0 - 0.25, -4.0 - 0.5 - 0.25, 4.0]
