"""Models are found by their `@register_model` decorator, not by a hand-kept list."""
from __future__ import annotations

import types

import pytest

from serve import model_support
from serve.models import MODELS, discover, model_class, register_model
from serve.models.registry import MODELS as REGISTRY


def test_every_model_module_registers_its_classes():
    found = discover()
    assert found is MODELS is REGISTRY
    assert set(MODELS) == set(model_support.ALL_ARCHS)
    for arch, cls in MODELS.items():
        assert cls.__name__ == arch and cls.__module__.startswith("serve.models.")


def test_model_class_picks_the_first_served_architecture():
    cfg = types.SimpleNamespace(architectures=["NotServed", "Qwen3ForCausalLM"])
    assert model_class(cfg) is MODELS["Qwen3ForCausalLM"]
    with pytest.raises(ValueError, match="not supported; supported: .*LlamaForCausalLM"):
        model_class(types.SimpleNamespace(architectures=["GPT2LMHeadModel"]))


def test_register_model_refuses_a_second_owner_and_bad_names():
    with pytest.raises(ValueError, match="'LlamaForCausalLM' is already served by "
                                         "serve.models.llama.LlamaForCausalLM"):
        register_model("LlamaForCausalLM")(type("Other", (), {}))
    with pytest.raises(TypeError, match="HF architecture names"):
        register_model()
    cls = MODELS["LlamaForCausalLM"]
    assert register_model("LlamaForCausalLM")(cls) is cls           # re-registering is a no-op
    assert MODELS["LlamaForCausalLM"] is cls


def test_a_new_decorated_class_is_served_without_other_edits():
    cls = register_model("ToyForCausalLM")(type("ToyForCausalLM", (), {}))
    try:
        assert model_class(types.SimpleNamespace(architectures=["ToyForCausalLM"])) is cls
    finally:
        del REGISTRY["ToyForCausalLM"]
