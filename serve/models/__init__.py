"""Model classes by HF architecture name."""
from __future__ import annotations

from .deepseek_v3 import DeepseekV3ForCausalLM
from .llama import LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM

MODELS = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
}


def model_class(cfg):
    for arch in getattr(cfg, "architectures", None) or []:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(f"model: architectures {getattr(cfg, 'architectures', None)} not supported; "
                     f"supported: {sorted(MODELS)}")
