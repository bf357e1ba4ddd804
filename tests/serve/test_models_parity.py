"""Greedy parity with HF transformers (same weights, float32, CPU).

Each tiny random config is saved as an HF checkpoint by transformers itself, loaded by the
Engine from that directory, and decoded in one batch that has: a prompt longer than the
chunked-prefill budget, two prompts sharing a 3-page prefix (prefix-cache hits), and short
prompts. A second run uses a pool too small for the batch, forcing retractions (recompute).
HF decodes each prompt alone with its own forward and KV cache.
"""
from __future__ import annotations

import pytest
import torch

from serve.config import DUMMY_CONFIGS
from serve.engine import Engine, SamplingParams

# ---- the HF side (also used by test_models_smollm2 / test_weights_loading) ----------------


def make_hf_checkpoint(name: str, path, *, seed: int = 0, std: float = 0.1, **overrides):
    """Random HF model of DUMMY_CONFIGS[name] saved under `path`; returns the float32 model.
    Larger-than-default init keeps greedy margins well above fp32 rounding; 1-D weights (norms,
    routing bias) are perturbed so that a missing or misplaced one shows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = {**DUMMY_CONFIGS[name], **overrides, "initializer_range": std}
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    model.save_pretrained(str(path))
    return model


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from HF's forward with its KV cache (what generate(do_sample=False) does,
    without its EOS handling: we compare ignore_eos runs)."""
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, use_cache=True)
    tokens = []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values,
                    use_cache=True)
    return tokens


# ---- the tests ------------------------------------------------------------------------------
NEW_TOKENS = 32
CONFIGS = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3"]


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    long_, mid, short = (torch.randint(3, vocab, (n,), generator=g).tolist() for n in (45, 17, 5))
    shared = mid[:12] + torch.randint(3, vocab, (6,), generator=g).tolist()
    return [long_, mid, short, shared]


@pytest.fixture(scope="module", params=CONFIGS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf_checkpoint(request.param, path)
    prompts = _prompts(hf.config.vocab_size)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    return request.param, str(path), prompts, expected


def _generate(path, prompts, **kw):
    engine = Engine(path, dtype="float32", device="cpu", page_size=4, **kw)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    return engine, [o.token_ids for o in outs]


def test_greedy_parity_batch_prefix_and_chunked_prefill(tiny):
    name, path, prompts, expected = tiny
    engine, got = _generate(path, prompts, chunked_prefill_size=32, num_kv_pages=256)
    assert len(prompts[0]) > engine.token_budget  # the long prompt is prefilled in chunks
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{name} prompt {i}: engine {g} != HF {e}"
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] > 0, stats
    assert stats["kv_pages_used"] == 0 and stats["running"] == 0


@pytest.mark.parametrize("tiny", ["tiny-llama", "tiny-deepseek-v3"], indirect=True)
def test_greedy_parity_under_retraction(tiny):
    name, path, prompts, expected = tiny
    # 4 requests need up to (45 + 32) / 4 + ... ~ 50 pages together; 24 pages force retractions.
    engine, got = _generate(path, prompts, chunked_prefill_size=64, num_kv_pages=24)
    assert engine.stats()["retractions"] > 0
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{name} prompt {i} after retraction: engine {g} != HF {e}"
    assert engine.stats()["kv_pages_used"] == 0
