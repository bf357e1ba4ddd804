"""The fused decode-step q/k norm + RoPE + K/V store (serve.forward_batch.FUSED_ROPE_STORE,
attention.rope_store_kv) forced onto the CPU: the Triton kernel under the interpreter (and the
registry's reference) give the unfused engine's greedy tokens and logprobs, with and without
q/k norm; mixed steps, fp8 caches and the CPU keep the separate ops."""
from __future__ import annotations

import pytest
import torch

import tskernels
from serve import forward_batch
from serve.engine import Engine, SamplingParams
from serve.forward_batch import KVPool
from serve.models import bound_ops
from tskernels import GQACacheSpec

KW = dict(device="cpu", dtype="float32", max_model_len=64, num_kv_pages=32, page_size=8,
          enable_prefix_caching=False, cpu_graphs=False, max_num_seqs=4)
PROMPTS = [[5, 17, 300, 42, 9], [7, 8, 9]]


def _run(engine):
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True,
                                                   temperature=0.0, logprobs=0))
    return [(o.token_ids, o.logprobs) for o in outs]


@pytest.mark.parametrize("model,backend", [("dummy:tiny-llama", "triton"),
                                           ("dummy:tiny-qwen3", "triton"),
                                           ("dummy:tiny-qwen3", None)])
def test_fused_rope_store_matches_unfused(model, backend, monkeypatch):
    want = _run(Engine(model, **KW))
    calls = []
    real = tskernels.attention.rope_store_kv

    def counted(q, *a, **kw):
        calls.append((q.shape[0], kw["q_norm_weight"] is not None, kw["backend"]))
        return real(q, *a, **kw)
    # the GPU's decision without its device condition
    monkeypatch.setattr(forward_batch, "fuses_rope_store",
                        lambda pool, nd, nr: forward_batch.FUSED_ROPE_STORE and not pool.fp8
                        and nd > 0 and nr == nd)
    monkeypatch.setattr(bound_ops, "ROPE_STORE_BACKEND", backend)
    monkeypatch.setattr(tskernels.attention, "rope_store_kv", counted)
    got = _run(Engine(model, **KW))
    assert calls and all(b == backend for *_, b in calls)
    assert all(norm == ("qwen3" in model) for _, norm, _ in calls)
    for (gt, glp), (wt, wlp) in zip(got, want):
        assert gt == wt
        assert max(abs(a - b) for a, b in zip(glp, wlp)) < 1e-4, (glp, wlp)


def test_fusion_taken_for_gpu_decode_only_steps(monkeypatch):
    spec = GQACacheSpec(num_layers=1, num_kv_heads=2, head_dim=16)
    pool = KVPool(spec, 4, 8, torch.float16, "cpu")
    assert forward_batch.FUSED_ROPE_STORE is True
    assert not forward_batch.fuses_rope_store(pool, 2, 2)  # the CPU keeps its bound store

    class OnGPU:  # the pool's caches as a GPU pool would report them
        is_mla, fp8, k = False, False, [torch.empty(0, device="meta")]
    assert forward_batch.fuses_rope_store(OnGPU, 2, 2)
    assert not forward_batch.fuses_rope_store(OnGPU, 2, 3)  # a mixed step: extend needs k, v
    assert not forward_batch.fuses_rope_store(OnGPU, 0, 1)  # prefill only
    OnGPU.fp8 = True
    assert not forward_batch.fuses_rope_store(OnGPU, 2, 2)  # fp8: store_kv's quantize
    OnGPU.fp8 = False
    monkeypatch.setattr(forward_batch, "FUSED_ROPE_STORE", False)
    assert not forward_batch.fuses_rope_store(OnGPU, 2, 2)
