"""The fused decode wiring of serve.models.layers (norms / SiLU-mul inside the gemvs, residual
adds in their epilogues; bound_ops.FUSE_DECODE_GEMV) run on the CPU through the reference ops:
the same greedy tokens and logprobs as the unfused engine, and the default CPU path untouched."""
from __future__ import annotations

import pytest
import torch

import tskernels
from serve.engine import Engine, SamplingParams
from serve.models import bound_ops

KW = dict(device="cpu", dtype="float32", max_model_len=128, num_kv_pages=64, page_size=8,
          enable_prefix_caching=False, cpu_graphs=False, max_num_seqs=4)
PROMPTS = [[5, 17, 300, 42, 9], [7, 8, 9], [100, 200, 300, 400, 11, 12, 13]]


def _run(engine):
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True,
                                                   temperature=0.0, logprobs=0))
    return [(o.token_ids, o.logprobs) for o in outs]


@pytest.mark.parametrize("model", ["dummy:tiny-llama", "dummy:tiny-qwen3-moe"])
def test_fused_decode_layers_match_unfused(model, monkeypatch):
    want = _run(Engine(model, **KW))
    calls = []
    real = tskernels.gemm.rmsnorm_gemv

    def counted(*a, **kw):
        calls.append(a[0].shape[0])
        return real(*a, **kw)
    monkeypatch.setattr(bound_ops, "FUSED_BACKEND", None)  # the registry's (reference) choice
    monkeypatch.setattr(bound_ops, "fuse_decode", lambda x, w: x.shape[0] <= 16)
    monkeypatch.setattr(tskernels.gemm, "rmsnorm_gemv", counted)
    got = _run(Engine(model, **KW))
    assert calls and max(calls) <= 16  # the decode steps took the fused form, prefill did not
    for (gt, glp), (wt, wlp) in zip(got, want):
        assert gt == wt
        assert len(glp) == len(wlp) == len(gt)
        assert max(abs(a - b) for a, b in zip(glp, wlp)) < 1e-4, (glp, wlp)


def test_fusion_is_off_by_default_and_never_on_cpu(monkeypatch):
    assert bound_ops.FUSE_DECODE_GEMV is False
    x, w = torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert not bound_ops.fuse_decode(x, w)
    monkeypatch.setattr(bound_ops, "FUSE_DECODE_GEMV", True)
    assert not bound_ops.fuse_decode(x, w)  # the CPU decode path stays the unfused one


def test_silu_down_alone_matches_unfused(monkeypatch):
    """FUSE_SILU_DOWN: the norms and the other gemvs unfused, SiLU-mul + residual add inside
    the down gemv: the same greedy tokens and logprobs as the unfused engine."""
    model = "dummy:tiny-llama"
    gate = bound_ops.fuse_silu_down
    x, w = torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert bound_ops.FUSE_SILU_DOWN is False
    with monkeypatch.context() as m:
        m.setattr(bound_ops, "FUSE_SILU_DOWN", True)
        assert not gate(x, w)  # never on the CPU
    want = _run(Engine(model, **KW))
    calls = []
    real = tskernels.gemm.silu_mul_gemv

    def counted(*a, **kw):
        calls.append(a[0].shape[0])
        return real(*a, **kw)
    monkeypatch.setattr(bound_ops, "FUSED_BACKEND", None)
    monkeypatch.setattr(bound_ops, "fuse_silu_down", lambda x, w: x.shape[0] <= 16)
    monkeypatch.setattr(tskernels.gemm, "silu_mul_gemv", counted)
    got = _run(Engine(model, **KW))
    assert calls and max(calls) <= 16
    for (gt, glp), (wt, wlp) in zip(got, want):
        assert gt == wt
        assert max(abs(a - b) for a, b in zip(glp, wlp)) < 1e-4, (glp, wlp)


def test_fused_moe_router_matches_unfused(monkeypatch):
    """FUSE_MOE_ROUTER: a softmax-routed MoE block's post-attention add + RMSNorm, router and
    routing as one op (moe.rmsnorm_router_topk_softmax, the registry's reference on the CPU)
    at decode sizes: the same greedy tokens and logprobs as the unfused engine."""
    model = "dummy:tiny-qwen3-moe"
    x = torch.zeros(1, 8, dtype=torch.bfloat16)
    assert bound_ops.FUSE_MOE_ROUTER is False
    gate = type("Gate", (), {"plain": lambda self: True,
                             "weight": torch.zeros(4, 8, dtype=torch.bfloat16)})()
    with monkeypatch.context() as m:
        m.setattr(bound_ops, "FUSE_MOE_ROUTER", True)
        assert not bound_ops.fuse_moe_router(x, gate)  # never on the CPU
    want = _run(Engine(model, **KW))
    calls = []
    real = tskernels.moe.rmsnorm_router_topk_softmax

    def counted(*a, **kw):
        calls.append((a[0].shape[0], kw.get("residual") is not None))
        return real(*a, **kw)
    monkeypatch.setattr(bound_ops, "fuse_moe_router", lambda x, gate: x.shape[0] <= 16)
    monkeypatch.setattr(tskernels.moe, "rmsnorm_router_topk_softmax", counted)
    got = _run(Engine(model, **KW))
    assert calls and max(n for n, _ in calls) <= 16 and all(r for _, r in calls)
    for (gt, glp), (wt, wlp) in zip(got, want):
        assert gt == wt
        assert max(abs(a - b) for a, b in zip(glp, wlp)) < 1e-4, (glp, wlp)
