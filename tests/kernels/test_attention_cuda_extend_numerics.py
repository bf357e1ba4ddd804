"""The CUDA prefill (tskernels/ops/attention/cuda/prefill_wgmma.cu) on the CPU tier: a float
model of exactly what the kernel computes, held to the dtype's tolerance against the float64
reference, plus its host-side pieces (argument checks, work list, the no-prefix trait and the
registration). The kernel itself runs in the GPU tier (test_attention_cuda_extend.py).

The model: per request, queries in 64-row groups (one consumer warpgroup each), keys in
128-key tiles from key 0; S = q k^T in fp32 from 16-bit operands; masked only on tiles at or
past the group's first row; running max m in base 2 (scale * log2 e folded into one constant);
p = exp2(S c - m) in fp32, summed unrounded into l, rounded to q's dtype for the P V product
(fp32 accumulation); O rescaled by exp2(m_old - m_new) every tile; out = O / l in q's dtype."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

import tskernels
from tskernels.numerics import assert_close
from tskernels.ops.attention import cuda_extend
from tskernels.testing import strategies as tst

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import make_paged, ref_extend
except ImportError:
    from test_attention_common import make_paged, ref_extend


def model_prefill(q, kseqs, vseqs, counts, scale, block_n=128):
    """What the kernel computes, in torch float32 (see the module docstring). kseqs / vseqs:
    each request's keys / values [L_b, Hkv, D]; its n_b queries sit at positions L_b - n_b .."""
    c = scale * math.log2(math.e)
    g = q.shape[1] // kseqs[0].shape[1] if kseqs else 1
    out = torch.empty(q.shape, dtype=q.dtype)
    start = 0
    for n, kseq, vseq in zip(counts, kseqs, vseqs):
        pre = kseq.shape[0] - n
        qs = q[start:start + n].float().transpose(0, 1)                       # [Hq, n, D]
        ks = kseq.float().transpose(0, 1).repeat_interleave(g, 0)             # [Hq, L, D]
        vs = vseq.float().transpose(0, 1).repeat_interleave(g, 0)
        for r0 in range(0, n, 64):  # one consumer warpgroup's rows
            rows = torch.arange(r0, min(r0 + 64, n))
            qr = qs[:, rows]
            m = torch.full((q.shape[1], len(rows)), -math.inf)
            l_ = torch.zeros_like(m)
            o = torch.zeros(q.shape[1], len(rows), q.shape[2])
            for j0 in range(0, pre + int(rows[-1]) + 1, block_n):
                keys = torch.arange(j0, min(j0 + block_n, kseq.shape[0]))
                s = qr @ ks[:, keys].transpose(1, 2)
                if j0 + block_n - 1 > pre + r0:  # the diagonal tile(s) of this group
                    s = s.masked_fill(keys[None, None, :] > pre + rows[None, :, None],
                                      -math.inf)
                m_new = torch.maximum(m, s.amax(-1) * c)
                alpha = torch.exp2(m - m_new)
                p = torch.exp2(s * c - m_new[..., None])
                l_ = l_ * alpha + p.sum(-1)
                o = o * alpha[..., None] + p.to(q.dtype).float() @ vs[:, keys]
                m = m_new
            out[start + r0:start + r0 + len(rows)] = (o / l_[..., None]).transpose(0, 1) \
                .to(q.dtype)
        start += n
    return out


def _sequences(kv, lens):
    """Each request's whole K and V ([L, Hkv, D]) gathered from the paged cache."""
    ps = kv.k_cache.shape[1]
    ks, vs = [], []
    for b, L in enumerate(lens):
        slots = [(int(kv.page_table[b, j // ps]), j % ps) for j in range(L)]
        ks.append(torch.stack([kv.k_cache[p, s] for p, s in slots]) if slots else
                  kv.k_cache[:0, 0])
        vs.append(torch.stack([kv.v_cache[p, s] for p, s in slots]) if slots else
                  kv.v_cache[:0, 0])
    return ks, vs


@st.composite
def problem(draw):
    hkv = draw(st.integers(1, 2))
    return dict(lens=draw(tst.seq_lens(max_batch=3, max_len=300)), hkv=hkv,
                prefix=draw(st.booleans()), page_size=draw(st.sampled_from([8, 16, 64])),
                group=draw(st.sampled_from([1, 2, 4, 8])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                spread=draw(st.sampled_from([0.0, 1.0, 4.0])),
                block_n=draw(st.sampled_from([64, 128])),
                seed=draw(st.integers(0, 2**31 - 1)))


@given(c=problem())
def test_cuda_prefill_arithmetic_matches_reference(c):
    """No prefix (the contiguous-K/V kernel) and cached prefixes (the paged one)."""
    gen = torch.Generator().manual_seed(c["seed"])
    lens = c["lens"]
    kv = make_paged(lens, c["page_size"], c["hkv"], 128, c["dtype"], None, "cpu", gen)
    new = [n if not c["prefix"] else int(torch.randint(0, n + 1, (1,), generator=gen))
           for n in lens]
    hq = c["hkv"] * c["group"]
    T = sum(new)
    # spread 0: all-zero q (uniform softmax); larger: wide logit ranges, most p tiny
    q = (torch.randn(T, hq, 128, generator=gen) * c["spread"]).to(c["dtype"])
    ks, vs = _sequences(kv, lens)
    o = model_prefill(q, ks, vs, new, 128 ** -0.5, c["block_n"])
    indptr = torch.tensor([0, *torch.tensor(new, dtype=torch.long).cumsum(0).tolist()],
                          dtype=torch.int32)
    truth, same = ref_extend(q, kv, indptr)
    assert_close(o, truth, baseline=same, name=f"cuda prefill arithmetic {c}")


def test_cuda_prefill_run_argument_checks():
    """The plan's host-side checks (before any launch), on CPU tensors: valid arguments pass,
    each broken one gets a clear ValueError."""
    from types import SimpleNamespace

    plan = SimpleNamespace(q_dtype=torch.bfloat16, num_rows=6, hq=8, hkv=2,
                           device=torch.device("cpu"))
    q = torch.zeros(6, 8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(6, 2 * 2 * 128 + 64, dtype=torch.bfloat16)  # a fused-QKV-like buffer
    k, v = kv[:, 64:64 + 256].view(6, 2, 128), kv[:, 64 + 256:].view(6, 2, 128)
    ok = dict(q=q, k=k, v=v, sinks=None, k_scale=None, v_scale=None, out=None)
    check = cuda_extend.check_run_args
    check(plan, **ok)
    check(plan, **{**ok, "out": torch.empty_like(q)})
    odd = torch.zeros(6, 2 * 128 + 4, dtype=torch.bfloat16)[:, 4:].view(6, 2, 128)
    bad = [({"sinks": torch.zeros(8)}, "sinks"), ({"k_scale": torch.ones(1)}, "scales"),
           ({"k": None}, "pass the new tokens"), ({"q": q.half()}, "q must be"),
           ({"q": q[:5]}, "q must be"), ({"k": k.float()}, "k must be"),
           ({"v": v[:, :1]}, "v must be"), ({"k": torch.zeros(6, 128, 2).transpose(1, 2)
                                             .to(torch.bfloat16)}, "packed heads"),
           ({"out": torch.empty(6, 8, 128)}, "out must be"), ({"k": odd}, "16-byte")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            check(plan, **{**ok, **change})


def test_cuda_prefill_work_list():
    """Every 128-row block of every request once, the blocks that see the most keys first."""
    counts = [300, 0, 1, 129, 128]
    work = cuda_extend.work_list(counts)
    assert sorted(work) == sorted((b, i) for b, n in enumerate(counts)
                                  for i in range(-(-n // 128)))
    keys = [min((i + 1) * 128, counts[b]) for b, i in work]
    assert keys == sorted(keys, reverse=True)


def test_extend_prefix_trait():
    from tskernels.ops.attention import _has_prefix
    qo = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    assert not _has_prefix(qo, torch.tensor([3, 0, 7], dtype=torch.int32))
    assert _has_prefix(qo, torch.tensor([3, 2, 7], dtype=torch.int32))
    assert not _has_prefix(torch.tensor([0], dtype=torch.int32),
                           torch.zeros(0, dtype=torch.int32))


def test_cuda_prefill_registration():
    """Hopper only, compile-checked for sm_90, and its traits keep everything it does not do
    (a cached prefix, non-causal, window, softcap, sinks, other head dims, no new K/V) away."""
    spec = next(k for k in tskernels.kernels() if k.name == "attention.extend.cuda")
    assert spec.band == "specialized"
    assert (spec.capability.min_sm, spec.capability.max_sm) == (90, 90)
    assert spec.verification.compiled == frozenset({"sm_90"})
    t = spec.traits
    assert t["head_dim"](128) and not t["head_dim"](64)
    assert t["prefix"](False) and not t["prefix"](True)
    assert t["causal"](True) and not t["causal"](False)
    assert t["new_kv"](True) and not t["new_kv"](False)
    for name in ("softcap", "sliding_window", "sinks"):
        assert t[name](False) and not t[name](True)
    # on this (CPU) machine the selector never offers it
    report = tskernels.explain("attention", "extend", device="cpu",
                               formats={"q": "bf16", "kv": "bf16"}, traits={"head_dim": 128})
    line = next(ln for ln in report.splitlines() if ln.strip().startswith("cuda"))
    assert "filtered: vendor 'cpu'" in line, report
