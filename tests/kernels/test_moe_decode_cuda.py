"""The one-token CUDA MoE kernel (moe.fused_experts.cuda_sm90) vs the float64 reference, on
the GPU tier (sm_90a: bulk copies into shared memory; CI compiles it,
tests/compile/test_cuda_sources.py), plus the CPU-side predicate and selection rules.

The kernel's workspace (the activation rows) is poisoned with NaN first, so a value it
reads before writing fails; its counters must be back at zero after every launch (graph
replays start from them); ids past the local experts and repeated experts are drawn."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.moe as ref
from tskernels.numerics import assert_close
from tskernels.ops.moe import cuda_decode_sm90 as md

from ._cuda_graphs import assert_replays_equal


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="sm_90a kernel: needs an H100 / H200")
QWEN3 = (2048, 768, 128, 8)  # hidden, intermediate, experts, top-k


def test_fits_takes_the_shapes_whose_rows_fit():
    """Qwen3-30B-A3B (16 rows x 8 experts, 192 KB, per CTA on 132 SMs) fits; H or I off the
    256 grid, rows past shared memory (Qwen3-235B's 4096 x 1536: 32 x 8 x 3 KB), fewer SMs than
    slots do not."""
    assert md.fits(2048, 768, 8, 132) and md.parts_for(8, 132) == 16
    assert md.rows_per_cta(2048, 8, 16) == 16
    assert md.smem_bytes(2048, 768, 8, 16) == 16 * 8 * 768 * 2 + 2048 * 4 + 8 * 768 * 2 + \
        8 * 16 * 4 + 8
    assert md.smem_bytes(2048, 768, 8, 16) <= md.SMEM_LIMIT
    assert not md.fits(4096, 1536, 8, 132)
    assert not md.fits(2048 + 128, 768, 8, 132) and not md.fits(2048, 640, 8, 132)
    assert not md.fits(2048, 768, 8, 7)
    # a 114-SM H100 PCIe: 14 parts, 112 CTAs of 19 rows x 8 experts x 1.5 KB: 228 KB > the limit
    assert not md.fits(2048, 768, 8, 114)


def test_decode_trait_only_for_one_token_on_cuda():
    cpu = torch.device("cpu")
    assert md.decode_traits(1, 2048, 768, 8, cpu) is False
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        assert md.decode_traits(2, 2048, 768, 8, dev) is False


def test_not_offered_to_an_mps_client_with_part_of_the_sms(monkeypatch):
    """The device reports every SM to an MPS client limited to a share; the grid spins on its
    own CTAs, so the trait says no there."""
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    assert md._sm_share_limited()
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
    assert not md._sm_share_limited()
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    assert not md._sm_share_limited()


def test_named_backend_refuses_other_problems():
    """Named explicitly, the backend refuses what it does not take with a clear error (the
    selector's trait check), never a launch."""
    x = torch.randn(2, 64)
    w13, w2 = torch.randn(4, 64, 64), torch.randn(4, 64, 32)
    w, ids = ref.topk_softmax(torch.randn(2, 4), 2)
    with pytest.raises(Exception, match="cuda_sm90|decode_prefetch|sm_90|nvidia|capab"):
        tskernels.moe.fused_experts(x, w13, w2, w, ids, backend="cuda_sm90")


def _problem(h, inter, e, k, dtype, seed, pattern="random", ids64=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, h, generator=gen)
    w13 = torch.randn(e, 2 * inter, h, generator=gen) / h ** 0.5
    w2 = torch.randn(e, h, inter, generator=gen) / inter ** 0.5
    weights, ids = ref.topk_softmax(torch.randn(1, e, generator=gen), k)
    if pattern == "non_local":
        ids[0, -1] = -1
        ids[0, 0] = e
    elif pattern == "repeated":   # not what top-k gives, but each slot is independent
        ids[0, 1] = ids[0, 0]
    ids = ids.long() if ids64 else ids
    return (x.cuda().to(dtype), w13.cuda().to(dtype), w2.cuda().to(dtype), weights.cuda(),
            ids.cuda())


def _want(x, w13, w2, w, ids):
    cpu = [a.cpu() for a in (x, w13, w2, w, ids)]
    want = ref.fused_experts(cpu[0].double(), cpu[1].double(), cpu[2].double(), cpu[3], cpu[4])
    base = ref.fused_experts(cpu[0].float(), cpu[1].float(), cpu[2].float(), cpu[3],
                             cpu[4]).to(x.dtype)
    return want, base


def _poison_workspace(h, inter, k, dtype, dev):
    key = (dev, h, inter, k, dtype)
    if key in md._work:
        for t in md._work[key]:
            t.fill_(float("nan"))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern", ["random", "non_local", "repeated"])
def test_qwen3_shape_against_float64(dtype, pattern):
    h, inter, e, k = QWEN3
    for seed, ids64 in ((0, False), (1, True)):
        x, w13, w2, w, ids = _problem(h, inter, e, k, dtype, seed, pattern, ids64)
        md.run(x, w13, w2, w, ids)  # builds the workspace
        _poison_workspace(h, inter, k, dtype, x.device)
        out = md.run(x, w13, w2, w, ids)
        want, base = _want(x, w13, w2, w, ids)
        assert out.dtype == dtype and out.shape == (1, h)
        assert_close(out, want, baseline=base, name=f"moe decode {pattern} {dtype} ids64={ids64}")
        assert int(md._counters(x.device).abs().sum()) == 0  # re-armed inside the launch


@pytest.mark.gpu
@needs_hopper
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), e=st.sampled_from([8, 16, 64]), k=st.sampled_from([4, 8]),
       dims=st.sampled_from([(256, 256), (1024, 256), (1280, 512), (2048, 512), (2048, 768)]))
def test_drawn_shapes_and_expert_counts(seed, e, k, dims):
    """Drawn H / I, top-k and expert counts (an E = 8 top-8 layer routes to every expert): on
    132 SMs, top-4 runs 132 CTAs of which the last have no output rows, H = 256 gives 2 rows per
    CTA and H = 1280 10 (row groups of 4 cut short)."""
    h, inter = dims
    x, w13, w2, w, ids = _problem(h, inter, e, k, torch.bfloat16, seed)
    out = md.run(x, w13, w2, w, ids)
    want, base = _want(x, w13, w2, w, ids)
    assert_close(out, want, baseline=base, name=f"moe decode {h}x{inter} E{e} top-{k}")


@pytest.mark.gpu
@needs_hopper
def test_selected_for_one_token_and_replays_in_a_graph():
    """The public op at T = 1 selects this kernel on sm_90 once it is run-verified (named here,
    so the test does not depend on verified.json), and a captured graph replays new inputs
    written in place, counters re-armed between replays."""
    h, inter, e, k = QWEN3
    x, w13, w2, w, ids = _problem(h, inter, e, k, torch.bfloat16, 3)
    eager = tskernels.moe.fused_experts(x, w13, w2, w, ids, backend="cuda_sm90")
    want, base = _want(x, w13, w2, w, ids)
    assert_close(eager, want, baseline=base)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        md.run(x, w13, w2, w, ids)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = md.run(x, w13, w2, w, ids)
    x2, _, _, w_2, ids2 = _problem(h, inter, e, k, torch.bfloat16, 4)
    x.copy_(x2)
    w.copy_(w_2)
    ids.copy_(ids2)
    want2 = md.run(x, w13, w2, w, ids).clone()
    assert_replays_equal(g, out, want2)
    assert int(md._counters(x.device).abs().sum()) == 0
    w2_, base2 = _want(x, w13, w2, w, ids)
    assert_close(want2, w2_, baseline=base2)


@pytest.mark.gpu
@needs_hopper
def test_matches_the_triton_decode_path(monkeypatch):
    """Same problem through the Triton direct path: both within bf16 tolerance of float64
    (the intermediate is rounded to bf16 on both); the plain launch and the programmatic
    dependent one (after a Triton routing launch) bit-equal."""
    h, inter, e, k = QWEN3
    x, w13, w2, w, ids = _problem(h, inter, e, k, torch.bfloat16, 7)
    logits = torch.randn(1, e, device="cuda")
    w, ids = tskernels.moe.topk_softmax(logits, k, backend="triton")
    ours = md.run(x, w13, w2, w, ids)
    monkeypatch.setattr(md, "PDL", False)
    w_, ids_ = tskernels.moe.topk_softmax(logits, k, backend="triton")
    assert torch.equal(md.run(x, w13, w2, w_, ids_), ours)
    tri = tskernels.moe.fused_experts(x, w13, w2, w, ids, backend="triton")
    want, base = _want(x, w13, w2, w, ids)
    assert_close(ours, want, baseline=base)
    assert_close(tri, want, baseline=base)
