"""A decode step captured in a CUDA graph, replayed with new data in the same buffers."""
from __future__ import annotations

import pytest
import torch

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close

try:
    from .test_attention_common import make_paged, ref_decode
except ImportError:
    from test_attention_common import make_paged, ref_decode

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
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile + warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
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
