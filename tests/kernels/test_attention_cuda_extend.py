"""CUDA causal prefill (tskernels/ops/attention/cuda/prefill_wgmma.cu: wgmma + TMA, sm_90a) vs
the references on the GPU: ragged batches of new requests (lengths 0, 1, not a multiple of the
128-row block or the 128-key tile), GQA 1-16, bf16 / fp16, K/V handed over as strided views of
a fused QKV-like buffer (as the model runner does), q as a strided view too, NaN-poisoned
outputs and pages, both launch tiles (64 / 128 keys), CUDA-graph replay with new data, and the
clear errors for what the kernel does not do. GPU only (pytest -m gpu); the source is
compile-checked in CI (tests/compile/test_cuda_sources.py)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import poisoned_like

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import capture_graph, make_paged, ref_extend
    from .test_attention_extend import new_token_kv
except ImportError:
    from test_attention_common import capture_graph, make_paged, ref_extend
    from test_attention_extend import new_token_kv

pytestmark = pytest.mark.gpu
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="CUDA wgmma prefill: sm_90 GPU tier only")


@st.composite
def prefill_problem(draw):
    hkv = draw(st.integers(1, 4))
    group = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    return dict(lens=draw(tst.seq_lens(max_batch=5, max_len=700)),
                page_size=draw(tst.page_sizes()), hq=hkv * group, hkv=hkv,
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                tile=draw(st.sampled_from([None, (64, 4), (128, 2)])),
                strided_q=draw(st.booleans()), one_shot=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31 - 1)))


def _inputs(c):
    gen = torch.Generator().manual_seed(c["seed"])
    lens, hq, hkv = c["lens"], c["hq"], c["hkv"]
    kv = make_paged(lens, c["page_size"], hkv, 128, c["dtype"], None, "cuda", gen)
    indptr = torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()],
                          dtype=torch.int32, device="cuda")
    T = int(indptr[-1])
    k, v = new_token_kv(kv, lens, lens, extra_cols=hq * 128)
    q = torch.randn(T, hq + (3 if c["strided_q"] else 0), 128, generator=gen)
    q = q.to("cuda", c["dtype"])[:, :hq]
    return kv, indptr, q, k, v


def _plan(c, kv, indptr, paged=False):
    if c.get("tile") is None:
        return attn.extend_plan(indptr, kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                                k_cache=kv.k_cache, q_dtype=c["dtype"],
                                backend="cuda_paged" if paged else "cuda")
    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    bn, stages = c["tile"]
    return CudaExtendPlan(indptr, kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                          num_kv_heads=c["hkv"], head_dim=128, page_size=c["page_size"],
                          q_dtype=c["dtype"], kv_dtype=c["dtype"], scale=128 ** -0.5,
                          block_n=bn, stages=stages, paged=paged)


def _run(c):
    kv, indptr, q, k, v = _inputs(c)
    if c.get("one_shot"):
        o = attn.extend(q, kv.k_cache, kv.v_cache, indptr, kv.page_table, kv.seq_lens, k=k,
                        v=v, backend="cuda")
        truth, same = ref_extend(q, kv, indptr)
        assert_close(o, truth, baseline=same, name=f"cuda prefill {c}")
    else:
        _check(c, kv, indptr, q, k=k, v=v)


def _check(c, kv, indptr, q, paged=False, **new_kv):
    """A plan's run into a NaN-poisoned `out` against the float64 reference."""
    out = poisoned_like(q)
    o = _plan(c, kv, indptr, paged).run(q, kv.k_cache, kv.v_cache, out=out, **new_kv)
    assert o is out
    truth, same = ref_extend(q, kv, indptr)
    assert_close(o, truth, baseline=same, name=f"cuda {'paged ' if paged else ''}prefill {c}")


@needs_hopper
@pytest.mark.parametrize("shard", tst.shards())
def test_cuda_prefill_matches_reference(shard):
    tst.run_sharded(lambda data: _run(data.draw(prefill_problem())), shard, data=st.data())


@needs_hopper
@pytest.mark.parametrize("tile", [None, (64, 4)])
def test_cuda_prefill_edges(tile):
    """Empty requests around others, single tokens, block / tile boundaries +-1, a long one."""
    for lens in ([0, 1, 0], [127, 128, 129], [63, 64, 65, 255, 256, 257], [3000, 0, 5]):
        _run(dict(lens=lens, page_size=16, hq=8, hkv=2, dtype=torch.bfloat16, tile=tile,
                  strided_q=True, seed=11))


@needs_hopper
def test_cuda_prefill_graph_replay():
    """Captured once, replayed with new q / K / V values in the same buffers."""
    c = dict(lens=[700, 33, 1500, 1], page_size=16, hq=8, hkv=2, dtype=torch.bfloat16,
             strided_q=False, seed=5)
    kv, indptr, q, k, v = _inputs(c)
    plan = _plan(c, kv, indptr)
    out = torch.empty_like(q)
    graph = capture_graph(lambda: plan.run(q, kv.k_cache, kv.v_cache, k=k, v=v, out=out))
    gen = torch.Generator().manual_seed(6)
    T, ps = q.shape[0], c["page_size"]
    slots = [(int(kv.page_table[b, j // ps]), j % ps) for b, n in enumerate(c["lens"])
             for j in range(n)]
    for step in range(3):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", q.dtype))
        k.copy_(torch.randn(k.shape, generator=gen).to("cuda", k.dtype))
        v.copy_(torch.randn(v.shape, generator=gen).to("cuda", v.dtype))
        for t, (page, slot) in enumerate(slots):  # the cache holds the same new values
            kv.k_cache[page, slot] = k[t]
            kv.v_cache[page, slot] = v[t]
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert T == len(slots)
        truth, same = ref_extend(q, kv, indptr)
        assert_close(out, truth, baseline=same, name=f"cuda prefill replay {step}")


@needs_hopper
def test_cuda_prefill_rejects_what_it_does_not_do():
    gen = torch.Generator().manual_seed(0)
    kv = make_paged([10, 20], 16, 1, 128, torch.bfloat16, None, "cuda", gen)
    kw = dict(num_q_heads=4, k_cache=kv.k_cache, q_dtype=torch.bfloat16, backend="cuda")
    prefix = torch.tensor([0, 5, 25], dtype=torch.int32, device="cuda")  # 5 of 10 new
    with pytest.raises(Exception, match="cannot run here|trait prefix"):
        attn.extend_plan(prefix, kv.page_table, kv.seq_lens, **kw)
    indptr = torch.tensor([0, 10, 30], dtype=torch.int32, device="cuda")
    for bad in (dict(softcap=5.0), dict(sliding_window=4), dict(sinks=True),
                dict(causal=False)):
        with pytest.raises(Exception, match="cannot run here|trait"):
            attn.extend_plan(indptr, kv.page_table, kv.seq_lens, **kw, **bad)
    plan = attn.extend_plan(indptr, kv.page_table, kv.seq_lens, **kw)
    q = torch.randn(30, 4, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pass the new tokens' k and v"):
        plan.run(q, kv.k_cache, kv.v_cache)
    k, v = new_token_kv(kv, [10, 20], [10, 20])
    with pytest.raises(ValueError, match="q must be"):
        plan.run(q.half(), kv.k_cache, kv.v_cache, k=k, v=v)
    with pytest.raises(ValueError, match="k must be"):
        plan.run(q, kv.k_cache, kv.v_cache, k=k[:, :, :64], v=v)
