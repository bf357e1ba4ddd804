"""tskernels_ref.moe vs naive per-token / per-expert Python loops in float64."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tskernels_ref import moe

from ._problems import rand


def naive_topk(scores, k):
    """Indices of the k largest entries of a Python list (lower index wins ties)."""
    return sorted(range(len(scores)), key=lambda e: (-scores[e], e))[:k]


@settings(max_examples=25, deadline=None)
@given(t=st.integers(0, 12), e=st.integers(1, 70), data=st.data(), renorm=st.booleans(), seed=st.integers(0, 2**31))
def test_topk_softmax(t, e, data, renorm, seed):
    k = data.draw(st.integers(1, min(e, 8)))
    logits = rand(t, e, gen=torch.Generator().manual_seed(seed), scale=3.0).float()
    w, ids = moe.topk_softmax(logits, k, renormalize=renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (t, k)
    for i in range(t):
        row = [float(x) for x in logits[i].double()]
        z = sum(math.exp(x) for x in row)
        p = [math.exp(x) / z for x in row]
        chosen = naive_topk(p, k)
        want = [p[c] for c in chosen]
        if renorm:
            want = [x / sum(want) for x in want]
        assert ids[i].tolist() == chosen
        torch.testing.assert_close(w[i].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(t=st.integers(0, 10), n_group=st.sampled_from([1, 2, 4, 8]), per_group=st.integers(2, 8),
       data=st.data(), renorm=st.booleans(), seed=st.integers(0, 2**31))
def test_topk_sigmoid_grouped(t, n_group, per_group, data, renorm, seed):
    e = n_group * per_group
    topk_group = data.draw(st.integers(1, n_group))
    k = data.draw(st.integers(1, topk_group * per_group))
    factor = data.draw(st.sampled_from([1.0, 2.5]))
    gen = torch.Generator().manual_seed(seed)
    logits, bias = rand(t, e, gen=gen, scale=2.0).float(), rand(e, gen=gen, scale=0.5).float()
    w, ids = moe.topk_sigmoid_grouped(logits, bias, k, n_group=n_group, topk_group=topk_group,
                                      routed_scaling_factor=factor, renormalize=renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    for i in range(t):
        s = [1 / (1 + math.exp(-float(x))) for x in logits[i].double()]
        c = [s[j] + float(bias[j]) for j in range(e)]
        group_score = []
        for g in range(n_group):
            members = sorted(c[g * per_group : (g + 1) * per_group], reverse=True)
            group_score.append(members[0] + members[1])
        groups = naive_topk(group_score, topk_group)
        allowed = [j for j in range(e) if j // per_group in groups]
        chosen = sorted(allowed, key=lambda j: (-c[j], j))[:k]
        want = [s[j] for j in chosen]
        if renorm:
            want = [x / sum(want) for x in want]
        want = [x * factor for x in want]
        assert ids[i].tolist() == chosen
        torch.testing.assert_close(w[i].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(0, 20), e=st.integers(1, 12), data=st.data(), block=st.sampled_from([1, 4, 16, 64]))
def test_align_by_expert(t, e, data, block):
    k = data.draw(st.integers(1, e))
    ids = torch.tensor([data.draw(st.permutations(range(e)))[:k] for _ in range(t)], dtype=torch.int32).view(t, k)
    sorted_ids, expert_ids, post = moe.align_by_expert(ids, e, block)
    numel = t * k
    want_ids, want_experts = [], []
    for x in range(e):
        seg = [i for i in range(numel) if int(ids.view(-1)[i]) == x]
        if not seg:
            continue
        padded = seg + [numel] * ((-len(seg)) % block)
        want_ids += padded
        want_experts += [x] * (len(padded) // block)
    total = int(post[0])
    assert post.dtype == sorted_ids.dtype == expert_ids.dtype == torch.int32
    assert total == len(want_ids) and total % block == 0
    assert sorted_ids[:total].tolist() == want_ids
    assert (sorted_ids[total:] == numel).all()
    assert expert_ids[: total // block].tolist() == want_experts
    assert sorted_ids.numel() >= total and expert_ids.numel() * block >= sorted_ids.numel()


def naive_fused_experts(x, w13, w2, weights, ids):
    t, h = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            gate = w13[e, :inter].double() @ x[i].double()
            up = w13[e, inter:].double() @ x[i].double()
            act = gate / (1 + torch.exp(-gate)) * up
            out[i] += float(weights[i, j]) * (w2[e].double() @ act)
    return out


@settings(max_examples=20, deadline=None)
@given(t=st.integers(0, 9), e=st.integers(1, 8), h=st.sampled_from([8, 24, 64]), inter=st.sampled_from([4, 16, 40]),
       data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31))
def test_fused_experts_and_combine(t, e, h, inter, data, dtype, seed):
    k = data.draw(st.integers(1, e))
    gen = torch.Generator().manual_seed(seed)
    x = rand(t, h, gen=gen).to(dtype)
    w13 = rand(e, 2 * inter, h, gen=gen, scale=h ** -0.5).to(dtype)
    w2 = rand(e, h, inter, gen=gen, scale=inter ** -0.5).to(dtype)
    weights, ids = moe.topk_softmax(rand(t, e, gen=gen).float(), k)
    out = moe.fused_experts(x, w13, w2, weights, ids)
    assert out.dtype == dtype and out.shape == (t, h)
    want = naive_fused_experts(x, w13, w2, weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    # combine of per-slot expert outputs reproduces the fused result
    per_slot = torch.zeros(t, k, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            per_slot[i, j] = naive_fused_experts(x[i : i + 1], w13, w2, torch.ones(1, 1), ids[i : i + 1, j : j + 1])[0]
    torch.testing.assert_close(moe.combine(per_slot.float(), weights).double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(moe.combine(per_slot, weights.double()), want, rtol=1e-12, atol=1e-12)


def test_fused_experts_fp8_blocks_match_dequantized_math():
    """Block-fp8 reference = float64 math on the dequantized weights and on the activations
    rounded to e4m3 per 1 x 128 group (x, and the SiLU-mul output)."""
    from tskernels_ref.gemm import quantize_fp8_block, quantize_fp8_per_token_group

    g = torch.Generator().manual_seed(3)
    t, h, i, e, k = 5, 256, 128, 3, 2
    x = torch.randn(t, h, generator=g)
    qs = [quantize_fp8_block(torch.randn(2 * i, h, generator=g) / 16) for _ in range(e)]
    q2s = [quantize_fp8_block(torch.randn(h, i, generator=g) / 16) for _ in range(e)]
    w13, s13 = torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])
    w2, s2 = torch.stack([q for q, _ in q2s]), torch.stack([s for _, s in q2s])
    weights, ids = moe.topk_softmax(torch.randn(t, e, generator=g), k)
    got = moe.fused_experts(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)

    def fq(a):  # e4m3 per 1 x 128 group and back
        q, s = quantize_fp8_per_token_group(a.float(), 128)
        return q.double() * s.double().repeat_interleave(128, 1)[:, :a.shape[1]]

    def deq(w, s):
        return w.double() * s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)

    want = torch.zeros(t, h, dtype=torch.float64)
    xq = fq(x)
    for r in range(t):
        for j in range(k):
            ex = int(ids[r, j])
            hh = xq[r] @ deq(w13[ex], s13[ex]).T
            act = torch.nn.functional.silu(hh[:i]) * hh[i:]
            y = fq(act.float()[None])[0] @ deq(w2[ex], s2[ex]).T
            want[r] += float(weights[r, j]) * y
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
