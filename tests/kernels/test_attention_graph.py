"""A decode step captured in a CUDA graph, replayed with new data in the same buffers."""
from __future__ import annotations

import pytest
import torch

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close

try:
    from .test_attention_common import capture_graph, make_paged, ref_decode
except ImportError:
    from test_attention_common import capture_graph, make_paged, ref_decode

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("kv_mode,lens", [(None, [1, 700, 4000, 33]),
                                          ("per_head", [3000, 0, 17, 2048])])
def test_decode_graph_replay(kv_mode, lens):
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator().manual_seed(11)
    kv = make_paged(lens, 16, 4, 128, dt, kv_mode, dev, gen)
    B, hq = len(lens), 16
    q = torch.randn(B, hq, 128, generator=gen).to(dev, dt)
    sinks = torch.randn(hq, generator=gen).to(dev)
    out = torch.empty_like(q)
    plan = attn.decode_plan(kv.page_table, kv.seq_lens, num_q_heads=hq, k_cache=kv.k_cache,
                            q_dtype=dt, sinks=True, softcap=30.0,
                            kv_scale_mode=kv_mode, backend="triton")
    run = lambda: plan.run(q, kv.k_cache, kv.v_cache, sinks=sinks,  # noqa: E731
                           k_scale=kv.k_scale, v_scale=kv.v_scale, out=out)
    g = capture_graph(run)
    for step in range(3):
        # New query, new cache contents, shorter lengths (pages stay valid): same buffers.
        q.copy_(torch.randn(B, hq, 128, generator=gen).to(dev, dt))
        fresh = make_paged(lens, 16, 4, 128, dt, kv_mode, dev, gen)
        kv.k_cache.copy_(fresh.k_cache[: kv.k_cache.shape[0]])
        kv.v_cache.copy_(fresh.v_cache[: kv.v_cache.shape[0]])
        kv.page_table.copy_(fresh.page_table)
        if kv_mode:
            kv.k_scale.copy_(fresh.k_scale)
            kv.v_scale.copy_(fresh.v_scale)
        kv.seq_lens.copy_(torch.clamp(fresh.seq_lens - step * 5, min=0))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        truth, same = ref_decode(q, kv, softcap=30.0, sinks=sinks, k_scale=kv.k_scale,
                                 v_scale=kv.v_scale)
        assert_close(out, truth.to(dev), baseline=same.to(dev), name=f"replay {step}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("heads,lens", [(16, [1, 700, 3000, 33]), (128, [2048, 0, 65])])
def test_mla_decode_graph_replay(heads, lens):
    """Absorbed-MLA decode captured once, replayed with new queries, latents and lengths."""
    import tskernels.ops.mla as mla
    import tskernels_ref.mla as mla_ref
    from tskernels.testing.problems import paged_kv

    dev, dt, scale = "cuda", torch.bfloat16, 192 ** -0.5
    gen = torch.Generator().manual_seed(5)
    kv = paged_kv(lens, 64, 1, 576, dtype=dt, device=dev, gen=gen)
    cache = kv.k_cache[:, :, 0]
    B = len(lens)
    q = torch.randn(B, heads, 576, generator=gen).to(dev, dt)
    out = torch.empty(B, heads, 512, dtype=dt, device=dev)
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=heads, kv_cache=cache,
                           scale=scale, q_dtype=dt, backend="triton")
    run = lambda: plan.run(q, cache, out=out)  # noqa: E731
    g = capture_graph(run)
    for step in range(3):
        q.copy_(torch.randn(B, heads, 576, generator=gen).to(dev, dt))
        fresh = paged_kv(lens, 64, 1, 576, dtype=dt, device=dev, gen=gen)
        cache.copy_(fresh.k_cache[: cache.shape[0], :, 0])
        kv.page_table.copy_(fresh.page_table)
        kv.seq_lens.copy_(torch.clamp(fresh.seq_lens - step * 7, min=0))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        args = (cache.cpu().double(), kv.page_table.cpu(), kv.seq_lens.cpu())
        truth = mla_ref.decode(q.cpu().double(), *args, scale=scale)
        same = mla_ref.decode(q.cpu(), cache.cpu(), *args[1:], scale=scale)
        assert_close(out, truth.to(dev), baseline=same.to(dev), name=f"mla replay {step}")
