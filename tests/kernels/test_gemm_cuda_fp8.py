"""The hand-written Hopper block-fp8 GEMM (gemm.fp8_block_mm.cuda_sm90) vs the float64
reference, on the GPU tier only (sm_90a: wgmma and TMA need a Hopper device; CI compiles it,
tests/compile/test_cuda_sources.py). Outputs are poisoned with NaN so an unwritten element
fails; shapes reach the M / N / K tails, K not a multiple of 16 (the padded TMA copy), an odd N
(the one-element stores), an odd number of K blocks (the paired main loop's padding block)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close

from ._cuda_graphs import assert_replays_equal

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="sm_90a kernel: needs an H100 / H200")
# every key given (missing ones would take cuda_fp8_sm90.CONFIG's, which may not fit with them)
_C = dict(pipe=False, cluster=1, cbuf=0, group_m=8)
CONFIGS = [dict(), dict(_C, block_n=128, stages=6, pipe=True), dict(_C, block_n=128, stages=6),
           dict(_C, block_n=256, stages=4), dict(_C, block_n=256, stages=4, cluster=2),
           dict(_C, block_n=128, stages=6, cluster=2), dict(_C, block_n=256, stages=4, cbuf=1),
           dict(_C, block_n=128, stages=5, cbuf=2), dict(_C, block_n=256, stages=3, cbuf=2),
           dict(_C, block_n=256, stages=4, cluster=2, cbuf=1),
           # one-pass tile widths (scales per 8 columns, the tail columns stored directly)
           dict(_C, block_n=176, stages=4, cbuf=2), dict(_C, block_n=192, stages=4, cbuf=1),
           dict(_C, block_n=144, stages=4), dict(_C, block_n=160, stages=5, cbuf=2)]


def _problem(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    qa, sa = ref.quantize_fp8_per_token_group((torch.randn(m, k, generator=g) * 3).cuda())
    qb, sb = ref.quantize_fp8_block((torch.randn(n, k, generator=g) * 0.05).cuda())
    return qa, sa, qb, sb


def _check(m, n, k, out_dtype, cfg, seed, a_view=False):
    from tskernels.ops.gemm import cuda_fp8_sm90
    qa, sa, qb, sb = _problem(m, n, k, seed)
    if a_view:  # rows 16 bytes apart but not the tensor's own: a column slice of a wider one
        wide = torch.zeros(m, k + 16, dtype=qa.dtype, device="cuda")
        wide[:, 8:8 + k] = qa
        qa = wide[:, 8:8 + k]
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    cuda_fp8_sm90.run(qa, sa, qb, sb, out, cfg)
    want = ref.fp8_block_mm(qa, sa.double(), qb, sb.double(), out_dtype=torch.float64)
    # fp8 operands are exact; the fp8 MMA adds its products with fewer than fp32's mantissa
    # bits, so every output dtype is held to bf16's bound (as for the Triton kernel)
    assert_close(out, want, dtype=torch.bfloat16,
                 baseline=ref.fp8_block_mm(qa, sa, qb, sb, out_dtype=out_dtype),
                 name=f"fp8 cuda {m}x{n}x{k} {cfg}")


@needs_hopper
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "shipped" if not c else
                         f"bn{c['block_n']}s{c['stages']}{'p' if c['pipe'] else ''}"
                         f"c{c.get('cluster', 1)}b{c.get('cbuf', 0)}")
@pytest.mark.parametrize("m,n,k", [(4096, 7168, 2048), (300, 2112, 7168), (129, 24576, 1536),
                                   (1, 256, 128), (257, 384, 1280), (200, 200, 300),
                                   (1000, 2112, 1024), (130, 4160, 512)])
def test_configs_against_reference(cfg, m, n, k):
    _check(m, n, k, torch.bfloat16, cfg, m * 7 + n + k)


@needs_hopper
@settings(max_examples=24, deadline=None)
@given(m=st.integers(1, 700), n=st.integers(1, 700), k=st.integers(1, 1500),
       out_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       cfg=st.sampled_from(CONFIGS), a_view=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_drawn_shapes(m, n, k, out_dtype, cfg, a_view, seed):
    _check(m, n, k, out_dtype, cfg, seed, a_view)


@needs_hopper
def test_selection_and_graph_replay():
    """Counting every candidate, the selector takes this kernel above 64 rows and the Triton
    split-K stream at decode rows; a captured launch replays into the same values."""
    qa, sa, qb, sb = _problem(512, 2112, 7168, 5)
    formats = {"a": "fp8_e4m3", "b": "fp8_e4m3", "c": "bf16"}
    for large, want in ((True, "cuda_sm90"), (False, "triton")):
        spec = tskernels.select("gemm", "fp8_block_mm", device=qa.device, formats=formats,
                                traits={"block": 128, "large_m": large}, allow_unverified=True)
        assert spec.backend == want, (large, spec.name)
    f = lambda: tskernels.gemm.fp8_block_mm(qa, sa, qb, sb, backend="cuda_sm90")  # noqa: E731
    c = f()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g = f()
    assert_replays_equal(graph, g, c)  # deterministic: same tiles, same order
    want = ref.fp8_block_mm(qa, sa.double(), qb, sb.double(), out_dtype=torch.float64)
    assert_close(c, want, dtype=torch.bfloat16,
                 baseline=ref.fp8_block_mm(qa, sa, qb, sb, out_dtype=torch.bfloat16))


@needs_hopper
def test_zero_sized_problems():
    from tskernels.ops.gemm import cuda_fp8_sm90
    qa, sa, qb, sb = _problem(3, 256, 256, 1)
    out = torch.full((3, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    cuda_fp8_sm90.run(qa[:, :0], sa[:, :0], qb[:, :0], sb[:, :0], out)
    assert torch.equal(out, torch.zeros_like(out))
    empty = tskernels.gemm.fp8_block_mm(qa[:0], sa[:0], qb, sb, backend="cuda_sm90")
    assert empty.shape == (0, 256)
