"""tskernels_ref.attention vs a naive float64 per-request, per-head, per-query formulation."""
from __future__ import annotations

import math

import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from tskernels_ref import attention
from tskernels_ref._common import FP8_DTYPE

from ._problems import GQA_GROUPS, HEAD_DIMS, PAGE_SIZES, build_paged, extend_lengths, indptr, rand, ragged_lengths


def naive_attention(q, k, v, q_pos, *, causal=True, scale, window=None, softcap=None, sinks=None):
    """float64; q [n, Hq, D], k/v [L, Hkv, D], q_pos list[int] -> (o [n, Hq, D], lse [n, Hq])."""
    n, hq, d = q.shape
    length, hkv, _ = k.shape
    o = torch.zeros(n, hq, d, dtype=torch.float64)
    lse = torch.full((n, hq), -math.inf, dtype=torch.float64)
    for h in range(hq):
        kh = h // (hq // hkv)
        for i in range(n):
            p = q_pos[i]
            visible = [j for j in range(length)
                       if (j <= p or not causal) and (window is None or j > p - window)]
            terms = []
            for j in visible:
                s = scale * float(q[i, h].double() @ k[j, kh].double())
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                terms.append(s)
            if sinks is not None:
                terms.append(float(sinks[h]))
            if not terms:
                continue
            m = max(terms)
            denom = sum(math.exp(t - m) for t in terms)
            for j, s in zip(visible, terms):
                o[i, h] += math.exp(s - m) / denom * v[j, kh].double()
            lse[i, h] = m + math.log(denom)
    return o, lse


@st.composite
def attention_case(draw, extend: bool):
    if extend:
        seq_lens, new = draw(extend_lengths(max_batch=3, max_len=24))
    else:
        seq_lens = draw(ragged_lengths(max_batch=4, max_len=40))
        new = [1] * len(seq_lens)
    hkv = draw(st.sampled_from([1, 2, 3]))
    group = draw(GQA_GROUPS)
    assume(hkv * group <= 24)
    return dict(
        seq_lens=seq_lens, new=new, page_size=draw(PAGE_SIZES), hkv=hkv, hq=hkv * group,
        d=draw(HEAD_DIMS) if not extend else draw(st.sampled_from([8, 16, 64])),
        window=draw(st.one_of(st.none(), st.integers(1, 12))),
        softcap=draw(st.one_of(st.none(), st.floats(2.0, 30.0))),
        sinks=draw(st.booleans()), causal=draw(st.booleans()) if extend else True,
        seed=draw(st.integers(0, 2**31)),
    )


def make_problem(case, cache_dtype=torch.float32):
    gen = torch.Generator().manual_seed(case["seed"])
    hq, hkv, d = case["hq"], case["hkv"], case["d"]
    ks = [rand(n, hkv, d, gen=gen) for n in case["seq_lens"]]
    vs = [rand(n, hkv, d, gen=gen) for n in case["seq_lens"]]
    kp = build_paged(ks, case["page_size"], cache_dtype, gen)
    vp = build_paged(vs, case["page_size"], cache_dtype, gen)
    vp.page_table.copy_(kp.page_table)  # same pages for K and V, as in an engine
    v_cache = torch.full_like(vp.cache, float("nan"))
    for b, v in enumerate(vs):  # rebuild V along K's page table
        for i in range(v.shape[0]):
            v_cache[kp.page_table[b, i // case["page_size"]], i % case["page_size"]] = v[i].to(cache_dtype)
    q = rand(sum(case["new"]), hq, d, gen=gen)
    sinks = rand(hq, gen=gen).float() if case["sinks"] else None
    return q, ks, vs, kp, v_cache, sinks


def naive_batch(q, ks, vs, case, sinks, scale, round_to):
    outs, lses, start = [], [], 0
    for b, length in enumerate(case["seq_lens"]):
        n = case["new"][b]
        o, lse = naive_attention(
            q[start : start + n], ks[b].to(round_to).double(), vs[b].to(round_to).double(),
            list(range(length - n, length)), causal=case["causal"], scale=scale,
            window=case["window"], softcap=case["softcap"], sinks=sinks)
        outs.append(o), lses.append(lse)
        start += n
    return torch.cat(outs), torch.cat(lses)


def _case(**kw):
    base = dict(page_size=16, hkv=1, hq=16, d=256, window=None, softcap=None, sinks=True,
                causal=True, seed=5)
    return {**base, **kw}


@settings(max_examples=30, deadline=None)
@given(case=attention_case(extend=False), dtype=st.sampled_from([torch.float32, torch.float64]))
@example(case=_case(seq_lens=[0, 1, 33, 17], new=[1, 1, 1, 1]), dtype=torch.float32)
def test_decode_matches_naive(case, dtype):
    q, ks, vs, kp, v_cache, sinks = make_problem(case, dtype)
    scale = 1.0 / math.sqrt(case["d"])
    o, lse = attention.decode(
        q.to(dtype), kp.cache, v_cache, kp.page_table, kp.seq_lens, sliding_window=case["window"],
        softcap=case["softcap"], sinks=sinks, return_lse=True)
    want_o, want_lse = naive_batch(q.to(dtype), ks, vs, case, sinks, scale, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    assert o.dtype == dtype and not o.isnan().any()
    torch.testing.assert_close(o.double(), want_o, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), want_lse, rtol=tol, atol=tol)


@settings(max_examples=30, deadline=None)
@given(case=attention_case(extend=True))
@example(case=_case(seq_lens=[0, 37, 5], new=[0, 20, 5], page_size=3, hkv=3, hq=15, d=64, window=9,
                    softcap=20.0, sinks=False))
def test_extend_matches_naive(case):
    q, ks, vs, kp, v_cache, sinks = make_problem(case)
    scale = 0.7 / math.sqrt(case["d"])
    o, lse = attention.extend(
        q.float(), kp.cache, v_cache, indptr(case["new"]), kp.page_table, kp.seq_lens,
        causal=case["causal"], scale=scale, sliding_window=case["window"], softcap=case["softcap"],
        sinks=sinks, return_lse=True)
    want_o, want_lse = naive_batch(q.float(), ks, vs, case, sinks, scale, torch.float32)
    assert not o.isnan().any()
    torch.testing.assert_close(o.double(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(case=attention_case(extend=False))
def test_decode_bf16(case):
    q, ks, vs, kp, v_cache, sinks = make_problem(case, torch.bfloat16)
    o = attention.decode(q.bfloat16(), kp.cache, v_cache, kp.page_table, kp.seq_lens,
                         sliding_window=case["window"], softcap=case["softcap"], sinks=sinks)
    want, _ = naive_batch(q.bfloat16(), ks, vs, case, sinks, 1.0 / math.sqrt(case["d"]), torch.bfloat16)
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.double(), want, rtol=2e-2, atol=2e-2)


def test_decode_zero_length_and_sink_only():
    k_cache = torch.full((2, 4, 1, 8), float("nan"))
    q = torch.randn(2, 2, 8)
    table = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    for sinks in (None, torch.tensor([0.5, -1.0])):
        o, lse = attention.decode(q, k_cache, k_cache, table, lens, sinks=sinks, return_lse=True)
        assert torch.equal(o, torch.zeros_like(o))
        want = torch.full_like(lse, -math.inf) if sinks is None else sinks.expand(2, 2)
        torch.testing.assert_close(lse, want)


@settings(max_examples=20, deadline=None)
@given(num_tokens=st.integers(1, 20), page_size=PAGE_SIZES, hkv=st.sampled_from([1, 2, 3]),
       d=st.sampled_from([8, 64]), per_head=st.booleans(), seed=st.integers(0, 2**31))
def test_store_kv(num_tokens, page_size, hkv, d, per_head, seed):
    gen = torch.Generator().manual_seed(seed)
    num_pages = -(-num_tokens // page_size) + 2
    slots = torch.randperm(num_pages * page_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.2] = -1  # padding rows
    k, v = rand(num_tokens, hkv, d, gen=gen, scale=3.0).float(), rand(num_tokens, hkv, d, gen=gen).float()
    for fp8 in (False, True):
        cache_dtype = FP8_DTYPE if fp8 else torch.bfloat16
        k_cache = torch.full((num_pages, page_size, hkv, d), float("nan")).to(cache_dtype)
        v_cache = k_cache.clone()
        scale = (torch.rand(hkv if per_head else 1, generator=gen) * 0.05 + 0.005) if fp8 else None
        attention.store_kv(k, v, k_cache, v_cache, slots, k_scale=scale, v_scale=scale)
        for t in range(num_tokens):
            s = int(slots[t])
            if s < 0:
                continue
            for name, src, cache in (("k", k, k_cache), ("v", v, v_cache)):
                got = cache[s // page_size, s % page_size].float()
                for h in range(hkv):
                    x = src[t, h].double()
                    if fp8:
                        sh = float(scale[h if per_head else 0])
                        want = (x / sh).clamp(-448, 448).to(FP8_DTYPE).float()
                    else:
                        want = x.to(torch.bfloat16).float()
                    assert torch.equal(got[h], want), (name, t, h)
        written = set(int(s) for s in slots if s >= 0)
        for s in range(num_pages * page_size):
            if s not in written:
                assert k_cache[s // page_size, s % page_size].float().isnan().all()


@settings(max_examples=15, deadline=None)
@given(case=attention_case(extend=False), per_head=st.booleans())
def test_decode_fp8_cache(case, per_head):
    gen = torch.Generator().manual_seed(case["seed"])
    hkv, d, page_size = case["hkv"], case["d"], case["page_size"]
    total = sum(case["seq_lens"])
    num_pages = sum(-(-n // page_size) for n in case["seq_lens"]) + 1
    table = torch.zeros(len(case["seq_lens"]), 64, dtype=torch.int32)
    # each request's pages are a slice of a permutation; slots follow its page-table row
    pages = torch.randperm(num_pages, generator=gen)
    cursor, slot_list = 0, []
    for b, n in enumerate(case["seq_lens"]):
        need = -(-n // page_size)
        table[b, :need] = pages[cursor : cursor + need].to(torch.int32)
        cursor += need
        slot_list += [int(table[b, i // page_size]) * page_size + i % page_size for i in range(n)]
    slots = torch.tensor(slot_list, dtype=torch.int64)
    k, v = rand(total, hkv, d, gen=gen).float(), rand(total, hkv, d, gen=gen).float()
    k_scale = torch.rand(hkv if per_head else 1, generator=gen) * 0.01 + 0.005
    v_scale = torch.rand(hkv if per_head else 1, generator=gen) * 0.01 + 0.005
    k_cache = torch.full((num_pages, page_size, hkv, d), float("nan")).to(FP8_DTYPE)
    v_cache = k_cache.clone()
    attention.store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    q = rand(len(case["seq_lens"]), case["hq"], d, gen=gen).float()
    o = attention.decode(q, k_cache, v_cache, table, torch.tensor(case["seq_lens"], dtype=torch.int32),
                         softcap=case["softcap"], k_scale=k_scale, v_scale=v_scale)
    deq = lambda x, s: (x / s.view(-1, 1)).clamp(-448, 448).to(FP8_DTYPE).double() * s.double().view(-1, 1)
    start = 0
    for b, n in enumerate(case["seq_lens"]):
        want, _ = naive_attention(q[b : b + 1], deq(k[start : start + n], k_scale), deq(v[start : start + n], v_scale),
                                  [n - 1], scale=1 / math.sqrt(d), softcap=case["softcap"])
        torch.testing.assert_close(o[b : b + 1].double(), want, rtol=1e-5, atol=1e-5)
        start += n


@settings(max_examples=25, deadline=None)
@given(length=st.integers(0, 30), split=st.integers(0, 30), hq=st.sampled_from([1, 3, 4]), seed=st.integers(0, 2**31))
def test_merge_states_equals_full(length, split, hq, seed):
    split = min(split, length)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand(2, hq, 16, gen=gen), rand(length, 1, 16, gen=gen), rand(length, 1, 16, gen=gen)
    full_o, full_lse = naive_attention(q, k, v, [length, length], scale=0.25)
    oa, la = naive_attention(q, k[:split], v[:split], [length, length], scale=0.25)
    ob, lb = naive_attention(q, k[split:], v[split:], [length, length], scale=0.25)
    o, lse = attention.merge_states(oa.float(), la.float(), ob.float(), lb.float())
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), full_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), full_lse, rtol=1e-5, atol=1e-5)
