"""CUDA fp8 paged decode (tskernels/ops/attention/cuda/decode_fp8.cu) vs the reference on the
GPU: ragged lengths (0, 1, not a page multiple), permuted page tables with NaN-poisoned unused
slots, GQA 1-8, pages 1-256, per-tensor and per-head scales, bf16 / fp16 q, split-KV. Held to
q's dtype tolerance against the exactly dequantised cache (q and p each split into two e4m3
terms must be as accurate as 16-bit operands), plus CUDA-graph replay with new data and the
clear errors for what the kernel does not do. GPU only (pytest -m gpu): the CPU tier cannot run
CUDA; the sources are compile-checked in CI (tests/compile/test_cuda_sources.py)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import poisoned_like

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import capture_graph, make_paged, ref_decode
except ImportError:
    from test_attention_common import capture_graph, make_paged, ref_decode

pytestmark = pytest.mark.gpu
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="CUDA backend: GPU tier only")


@st.composite
def cuda_problem(draw):
    hkv = draw(st.integers(1, 4))
    group = draw(st.sampled_from([1, 2, 3, 4, 5, 8]))
    return dict(lens=draw(tst.seq_lens(max_batch=8, max_len=3000)),
                page_size=draw(tst.page_sizes()), hq=hkv * group, hkv=hkv, d=128,
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                kv_mode=draw(st.sampled_from(["per_tensor", "per_head"])),
                num_splits=draw(st.one_of(st.none(), st.integers(1, 6))),
                warps_stages=draw(st.sampled_from([None, (4, 2), (2, 3), (4, 3), (2, 4), (8, 2)])),
                seed=draw(st.integers(0, 2**31 - 1)))


def _run(c, out_override=None):
    gen = torch.Generator().manual_seed(c["seed"])
    kv = make_paged(c["lens"], c["page_size"], c["hkv"], c["d"], c["dtype"], c["kv_mode"],
                    "cuda", gen)
    q = torch.randn(len(c["lens"]), c["hq"], c["d"], generator=gen).to("cuda", c["dtype"])
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                            k_cache=kv.k_cache, q_dtype=c["dtype"], kv_scale_mode=c["kv_mode"],
                            num_splits=c["num_splits"], backend="cuda")
    if c.get("warps_stages") is not None:
        from tskernels.ops.attention.cuda_decode import CudaDecodePlan
        nw, ns = c["warps_stages"]
        plan = CudaDecodePlan(kv.page_table, kv.seq_lens, num_q_heads=c["hq"],
                              num_kv_heads=c["hkv"], head_dim=c["d"],
                              page_size=c["page_size"], q_dtype=c["dtype"],
                              kv_dtype=kv.k_cache.dtype, scale=c["d"] ** -0.5,
                              num_splits=c["num_splits"], num_warps=nw, num_stages=ns)
    out = poisoned_like(q)
    o = plan.run(q, kv.k_cache, kv.v_cache, k_scale=kv.k_scale, v_scale=kv.v_scale, out=out)
    assert o is out
    truth, same = ref_decode(q, kv, k_scale=kv.k_scale, v_scale=kv.v_scale)
    assert_close(o, truth, baseline=same, name=f"cuda decode {c}")


@needs_cuda
@pytest.mark.parametrize("shard", tst.shards())
def test_cuda_decode_matches_reference(shard):
    tst.run_sharded(lambda data: _run(data.draw(cuda_problem())), shard, data=st.data())


@needs_cuda
@pytest.mark.parametrize("page_size,group", [(16, 4), (1, 1), (256, 8)])
def test_cuda_decode_edges(page_size, group):
    """Every request empty but one, a single key, a full last page, with and without splits."""
    for lens in ([0, 0, 1], [page_size, 2 * page_size - 1, 0], [4100]):
        for ns in (None, 1, 3):
            _run(dict(lens=lens, page_size=page_size, hq=2 * group, hkv=2, d=128,
                      dtype=torch.bfloat16, kv_mode="per_head", num_splits=ns, seed=3))


@needs_cuda
def test_cuda_decode_graph_replay():
    """Captured once, replayed with new q / cache contents / lengths in the same buffers."""
    gen = torch.Generator().manual_seed(5)
    lens = [700, 33, 1500, 1]
    kv = make_paged(lens, 16, 2, 128, torch.bfloat16, "per_tensor", "cuda", gen)
    q = torch.randn(len(lens), 8, 128, generator=gen).to("cuda", torch.bfloat16)
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=8, k_cache=kv.k_cache,
                            q_dtype=torch.bfloat16, kv_scale_mode="per_tensor", num_splits=3,
                            backend="cuda")
    out = torch.empty_like(q)
    run = lambda: plan.run(q, kv.k_cache, kv.v_cache, k_scale=kv.k_scale,  # noqa: E731
                           v_scale=kv.v_scale, out=out)
    graph = capture_graph(run)
    for step in range(3):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", q.dtype))
        kv.seq_lens.copy_(torch.tensor([700 - step, 33 - step, 1500 - 2 * step, 1],
                                       dtype=torch.int32))  # shorter: the slots stay valid
        for cache in (kv.k_cache, kv.v_cache):  # new values in the used slots only
            used = ~torch.isnan(cache.float())
            new = torch.randn(cache.shape, generator=gen).to("cuda", cache.dtype)
            cache[used] = new[used]
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        truth, same = ref_decode(q, kv, k_scale=kv.k_scale, v_scale=kv.v_scale)
        assert_close(out, truth, baseline=same, name=f"cuda decode replay {step}")


@needs_cuda
def test_cuda_decode_rejects_what_it_does_not_do():
    gen = torch.Generator().manual_seed(0)
    kv = make_paged([10], 16, 1, 128, torch.bfloat16, "per_tensor", "cuda", gen)
    kw = dict(num_q_heads=4, k_cache=kv.k_cache, q_dtype=torch.bfloat16,
              kv_scale_mode="per_tensor", backend="cuda")
    for bad in (dict(softcap=5.0), dict(sliding_window=4), dict(sinks=True)):
        with pytest.raises(Exception, match="cannot run here|trait"):
            attn.decode_plan(kv.page_table, kv.seq_lens, **kw, **bad)
    kv16 = make_paged([10], 16, 1, 128, torch.bfloat16, None, "cuda", gen)
    with pytest.raises(Exception, match="cannot run here|format"):
        attn.decode_plan(kv16.page_table, kv16.seq_lens, num_q_heads=4, k_cache=kv16.k_cache,
                         q_dtype=torch.bfloat16, backend="cuda")
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, **kw)
    q = torch.randn(1, 4, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        plan.run(q, kv.k_cache, kv.v_cache)
    with pytest.raises(ValueError, match="planned for q"):
        plan.run(q.half(), kv.k_cache, kv.v_cache, k_scale=kv.k_scale, v_scale=kv.v_scale)
