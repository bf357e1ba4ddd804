"""The config-support table (serve.model_support): every math-changing field is either served
exactly (HF parity below: GeGLU-tanh MLPs, sliding-window layers, alternating with full ones,
windows that cross page boundaries in prefill and in decode) or refused at load by name."""
from __future__ import annotations

import json

import pytest
import torch

from serve import model_support as ms
from serve.config import DUMMY_CONFIGS, load_model_config
from serve.engine import Engine, SamplingParams
from tests.serve.test_models_parity import hf_greedy, make_hf_checkpoint

NEW_TOKENS = 24


def _dummy(tmp_path, name: str, **overrides) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DUMMY_CONFIGS[name], **overrides}))
    return f"dummy:{path}"


# ---- refusals: one per rule that can refuse ------------------------------------------------
@pytest.mark.parametrize("name, overrides, field", [
    ("tiny-llama", {"hidden_act": "gelu"}, "hidden_act"),            # exact (erf) GELU
    ("tiny-llama", {"hidden_act": "relu2"}, "hidden_act"),
    ("tiny-qwen3-moe", {"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),   # MoE experts: SiLU
    ("tiny-llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
    ("tiny-llama", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 16,
                                     "long_factor": [1.0] * 16, "factor": 2.0,
                                     "original_max_position_embeddings": 1024}}, "rope_type"),
    ("tiny-llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("tiny-llama", {"mlp_bias": True}, "mlp_bias"),
    ("tiny-llama", {"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ("tiny-qwen3", {"use_sliding_window": True, "sliding_window": 8,
                    "layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ("tiny-qwen3", {"use_sliding_window": False,
                    "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),
    ("tiny-deepseek-v3", {"attention_bias": True}, "attention_bias"),
    ("tiny-deepseek-v3", {"moe_layer_freq": 2}, "moe_layer_freq"),
])
def test_unsupported_config_is_refused_by_name(tmp_path, name, overrides, field):
    with pytest.raises(ms.UnsupportedConfigError, match=field) as e:
        load_model_config(_dummy(tmp_path, name, **overrides))
    assert "refused" in str(e.value)


def test_every_problem_is_named_at_once(tmp_path):
    with pytest.raises(ms.UnsupportedConfigError) as e:
        load_model_config(_dummy(tmp_path, "tiny-llama", hidden_act="gelu", mlp_bias=True))
    assert "hidden_act" in str(e.value) and "mlp_bias" in str(e.value)


@pytest.mark.parametrize("name, overrides", [
    ("tiny-llama", {}), ("tiny-llama", {"hidden_act": "gelu_pytorch_tanh"}),
    ("tiny-llama", {"hidden_act": "gelu_new", "attention_bias": True}),
    ("tiny-llama", {"sliding_window": 16}),          # HF Llama does not read it
    ("tiny-llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 1024}}),
    ("tiny-qwen3", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    ("tiny-qwen3-moe", {}), ("tiny-deepseek-v3", {}), ("kimi-k2", {}),
])
def test_supported_configs_load(tmp_path, name, overrides):
    cfg, _ = load_model_config(_dummy(tmp_path, name, **overrides))
    assert ms.problems(cfg) == []


def test_layer_windows_follow_hf():
    from transformers import AutoConfig

    def cfg(model_type, **kw):
        d = {**DUMMY_CONFIGS["tiny-qwen3"], "num_hidden_layers": 4, **kw}
        d.pop("model_type")
        arch = {"qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
                "llama": "LlamaForCausalLM"}[model_type]
        return AutoConfig.for_model(model_type, **{**d, "architectures": [arch]})

    assert ms.layer_windows(cfg("qwen3")) == [None] * 4                      # off by default
    assert ms.layer_windows(cfg("qwen3", use_sliding_window=True, sliding_window=8,
                                max_window_layers=2)) == [None, None, 8, 8]
    alt = ["sliding_attention", "full_attention"] * 2
    assert ms.layer_windows(cfg("qwen3", use_sliding_window=True, sliding_window=8,
                                layer_types=alt)) == [8, None, 8, None]
    assert ms.layer_windows(cfg("mistral", sliding_window=5)) == [5] * 4
    assert ms.layer_windows(cfg("mistral", sliding_window=None)) == [None] * 4
    assert ms.layer_windows(cfg("llama", sliding_window=5)) == [None] * 4


def test_table_lists_every_served_architecture():
    from serve.models import MODELS

    covered = {a for r in ms.SUPPORT_TABLE for a in r.archs}
    assert covered == set(MODELS)
    md = ms.support_table_markdown()
    assert md.count("\n") == len(ms.SUPPORT_TABLE) + 1 and "`hidden_act`" in md


# ---- HF parity of the newly implemented math ------------------------------------------------
_ALTERNATING = dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=6,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])
PARITY = {
    # GeGLU-tanh MLP on a Llama
    "llama-gelu-tanh": ("tiny-llama", dict(hidden_act="gelu_pytorch_tanh")),
    # Qwen3 with windowed and full layers alternating; window 6 over 4-token pages: the window
    # starts mid-page, in prefill (prompts of 13 and 21 tokens) and moves across pages in decode
    "qwen3-alternating-window": ("tiny-qwen3", _ALTERNATING),
    # Qwen3's own default layout: full layers below max_window_layers, windowed above
    "qwen3-max-window-layers": ("tiny-qwen3", dict(use_sliding_window=True, sliding_window=5,
                                                   max_window_layers=1)),
    # Qwen3-MoE: every layer windowed when use_sliding_window
    "qwen3-moe-window": ("tiny-qwen3-moe", dict(use_sliding_window=True, sliding_window=6)),
    # Mistral-style: every layer windowed
    "mistral-window": ("tiny-llama", dict(model_type="mistral",
                                          architectures=["MistralForCausalLM"],
                                          sliding_window=7)),
}


@pytest.fixture(scope="module", params=sorted(PARITY))
def windowed(request, tmp_path_factory):
    base, overrides = PARITY[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf_checkpoint(base, path, **overrides)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist()
               for n in (21, 13, 3)]
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    return request.param, str(path), prompts, expected


def test_hf_parity_new_math(windowed):
    name, path, prompts, expected = windowed
    # chunked prefill (budget 8): windowed layers also see a cached prefix inside the window
    engine = Engine(path, dtype="float32", device="cpu", page_size=4, chunked_prefill_size=8,
                    num_kv_pages=64)
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                   ignore_eos=True))
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert o.token_ids == e, f"{name} prompt {i}: engine {o.token_ids} != HF {e}"


def test_windows_change_the_answer(tmp_path):
    """The parity above is not vacuous: the same weights with full attention everywhere
    decode differently from HF's windowed model."""
    hf = make_hf_checkpoint("tiny-qwen3", tmp_path, **_ALTERNATING)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, hf.config.vocab_size, (21,), generator=g).tolist()
    expected = hf_greedy(hf, prompt, NEW_TOKENS)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["use_sliding_window"] = False
    cfg.pop("layer_types", None)
    cfg["sliding_window"] = None
    cfg_path.write_text(json.dumps(cfg))
    engine = Engine(str(tmp_path), dtype="float32", device="cpu", page_size=4, num_kv_pages=64)
    out = engine.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                   ignore_eos=True))[0]
    assert out.token_ids != expected


def test_docs_carry_the_current_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "SERVING.md").read_text()
    assert ms.support_table_markdown() in doc, "regenerate: python -m serve.model_support"


def test_rope_types_are_what_the_rope_op_computes():
    from tskernels.ops.rope import SCALINGS

    assert set(ms.ROPE_TYPES) == {s for s in SCALINGS if s is not None}
