"""CUDA absorbed-MLA decode (mla.decode.cuda: tskernels/ops/mla/cuda/mla_decode_wgmma.cu, wgmma +
TMA, sm_90a) vs tskernels_ref.mla on the GPU: ragged lengths (0, 1, on / off tile and page
boundaries), pages of 64-256 rows, permuted page tables with NaN in every unused row, 1-192
heads (64-head blocks, a partial last one), bf16 / fp16 q, 16-bit or fp8-e4m3 latents (per-tensor
scale), forced split counts (empty splits included), strided q / out, NaN-poisoned outputs;
CUDA-graph replay with new data; clear errors. GPU only (pytest -m gpu)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.mla as mla
import tskernels_ref.mla as ref
from tskernels.ops.mla.cuda_decode import CudaMLADecodePlan
from tskernels.registry import SelectionError
from tskernels.testing import strategies as tst
from tskernels.testing.problems import paged_kv

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_mla import _check as _check_mla
    from .test_mla import _latent
except ImportError:
    from test_mla import _check as _check_mla
    from test_mla import _latent

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HOPPER, reason="CUDA wgmma MLA decode: sm_90 GPU tier only")]
SCALE = 0.07
FP8 = torch.float8_e4m3fn


@st.composite
def problem(draw):
    return dict(lens=draw(tst.seq_lens(max_batch=6, max_len=1500)),
                heads=draw(st.sampled_from([1, 16, 64, 100, 128, 192])),
                page_size=draw(st.sampled_from([64, 128, 256])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                splits=draw(st.sampled_from([None, 1, 2, 3, 7, 40])),
                strided=draw(st.booleans()), fp8=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31 - 1)))


def _make(c):
    """Pages with NaN in every unused row (fp8: quantised with a per-tensor scale, NaN kept)."""
    gen = torch.Generator().manual_seed(c["seed"])
    kv, cache, scale = _latent(dict(c, fp8=c.get("fp8", False)), "cuda", gen)
    B, H = len(c["lens"]), c["heads"]
    q = torch.randn(B, H + (1 if c["strided"] else 0), 576, generator=gen)
    return kv, cache, q.to("cuda", c["dtype"])[:, :H], scale


def _check(o, q, cache, kv, scale=None):
    """Against float64 math on the same (dequantised) rows (test_mla's check)."""
    _check_mla(o, ref.decode, q, cache, kv.page_table, kv.seq_lens, scale=SCALE, kv_scale=scale)


def _run(c):
    kv, cache, q, scale = _make(c)
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=c["heads"], kv_cache=cache,
                           scale=SCALE, q_dtype=c["dtype"], num_splits=c["splits"],
                           backend="cuda")
    assert type(plan).__name__ == "CudaMLADecodePlan"
    B, H = q.shape[:2]
    big = torch.full((B, H + (2 if c["strided"] else 0), 512), float("nan"), dtype=q.dtype,
                     device="cuda")
    out = big[:, :H]
    o = plan.run(q, cache, kv_scale=scale, out=out)
    assert o.data_ptr() == out.data_ptr()
    if c["strided"]:
        assert big[:, H:].isnan().all(), "wrote past the heads of out"
    _check(o, q, cache, kv, scale)


@pytest.mark.parametrize("shard", tst.shards())
def test_cuda_mla_decode_matches_reference(shard):
    tst.run_sharded(lambda data: _run(data.draw(problem())), shard, data=st.data())


@pytest.mark.parametrize("splits", [1, 2, 5, 64])
def test_cuda_mla_decode_edges(splits):
    """Lengths around tile (64) and page boundaries, an empty request, more splits than
    tiles (empty splits write o = 0 / lse = -inf)."""
    for page in (64, 256):
        _run(dict(lens=[0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 2049], heads=128,
                  page_size=page, dtype=torch.bfloat16, splits=splits, strided=False,
                  seed=splits * 7 + page))


@pytest.mark.parametrize("splits", [1, 3])
def test_cuda_mla_decode_fp8_latents(splits):
    """Full and partial tiles, 16 / 128 heads, bf16 / fp16 q against the dequantised rows."""
    for lens, heads, dtype in (([256, 128], 16, torch.bfloat16),
                               ([1000, 64, 0, 1, 77], 128, torch.bfloat16),
                               ([1000, 65, 3], 16, torch.float16)):
        c = dict(lens=lens, heads=heads, page_size=64, dtype=dtype, splits=splits,
                 strided=False, fp8=True, seed=splits)
        kv, cache, q, scale = _make(c)
        plan = CudaMLADecodePlan(kv.page_table, kv.seq_lens, num_heads=heads, kv_lora_rank=512,
                                 rope_dim=64, page_size=64, scale=SCALE, num_splits=splits,
                                 kv_dtype=FP8, q_dtype=dtype)
        _check(plan.run(q, cache, kv_scale=scale), q, cache, kv, scale)


def test_cuda_mla_decode_large_logits():
    """Logits spread over a wide range (one key dominating per head): the running max is
    passed between the two consumers and every rescale must use it."""
    c = dict(lens=[1000, 333], heads=64, page_size=64, dtype=torch.bfloat16, splits=1,
             strided=False, seed=5)
    kv, cache, q, _ = _make(c)
    q = q * 8
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=64, kv_cache=cache,
                           scale=SCALE, q_dtype=q.dtype, num_splits=1, backend="cuda")
    _check(plan.run(q, cache), q, cache, kv)


@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_mla_decode_graph_replay(fp8):
    """A captured run replays with new q, cache contents and lengths in the same buffers."""
    c = dict(lens=[700, 64, 1], heads=128, page_size=64, dtype=torch.bfloat16, splits=None,
             strided=False, fp8=fp8, seed=11)
    kv, cache, q, scale = _make(c)
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=128, kv_cache=cache,
                           scale=SCALE, q_dtype=q.dtype, max_seq_len=1024, backend="cuda")
    assert type(plan).__name__ == "CudaMLADecodePlan"
    out = torch.empty(3, 128, 512, dtype=q.dtype, device="cuda")
    plan.run(q, cache, kv_scale=scale, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(q, cache, kv_scale=scale, out=out)
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        owned = ~cache.float().isnan()
        new = torch.randn(cache.shape, generator=gen).to("cuda")
        cache.copy_(torch.where(owned, new, cache.float()).to(cache.dtype))
        if fp8:
            scale.fill_(0.5 * seed)
        kv.seq_lens.copy_(torch.tensor([650 + seed, 60, 0], dtype=torch.int32))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(out, q, cache, kv, scale)


def test_cuda_mla_decode_named_and_rejections():
    c = dict(lens=[100, 5], heads=64, page_size=64, dtype=torch.bfloat16, splits=None,
             strided=False, seed=3)
    kv, cache, q, _ = _make(c)
    o = mla.decode(q, cache, kv.page_table, kv.seq_lens, scale=SCALE, backend="cuda")
    _check(o, q, cache, kv)
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=64, kv_cache=cache,
                           scale=SCALE, q_dtype=q.dtype, backend="cuda")
    with pytest.raises(ValueError, match="q must be"):
        plan.run(q.half(), cache)
    with pytest.raises(ValueError, match="kv_cache must be"):
        plan.run(q, cache[:, :, :].transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="kv_scale is required"):
        plan.run(q, cache, kv_scale=torch.ones(1, device="cuda"))
    with pytest.raises(SelectionError, match="cache_like_q"):  # fp16 cache, bf16 q
        mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=64, kv_cache=cache.half(),
                        scale=SCALE, q_dtype=q.dtype, backend="cuda")
    f8 = cache.float().nan_to_num(0).to(FP8)
    p8 = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=64, kv_cache=f8, scale=SCALE,
                         q_dtype=q.dtype, backend="cuda")
    with pytest.raises(ValueError, match="kv_scale is required"):
        p8.run(q, f8)
    with pytest.raises(ValueError, match="kv_scale must be"):
        p8.run(q, f8, kv_scale=torch.ones(2, device="cuda"))
    with pytest.raises(ValueError, match="kv_cache must be"):  # a 16-bit cache, fp8 plan
        p8.run(q, cache, kv_scale=torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="out must be"):
        plan.run(q, cache, out=torch.empty(2, 64, 512, device="cuda"))
    small = paged_kv([10], 16, 1, 576, device="cuda").k_cache[:, :, 0].contiguous()
    with pytest.raises(SelectionError, match="page_size"):
        mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=64, kv_cache=small,
                        scale=SCALE, backend="cuda")
    with pytest.raises(ValueError, match="heads"):
        CudaMLADecodePlan(kv.page_table, kv.seq_lens, num_heads=2000, kv_lora_rank=512,
                          rope_dim=64, page_size=64, scale=SCALE)
