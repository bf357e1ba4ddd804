"""Llama family (Llama-2/3, SmolLM2), Mistral and Qwen3 dense: GQA + RoPE + gated MLP (SwiGLU or
GeGLU-tanh), pre-norm, optional sliding-window layers (per layer: serve.model_support)."""
from __future__ import annotations

from tskernels import GQACacheSpec

from ..config import rope_params
from ..model_support import layer_windows, mlp_activation
from .registry import register_model
from .layers import CausalLM, DecoderLayer, GatedMLP, PagedAttention, Rotary, rope_table


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    qk_norm = False

    def __init__(self, cfg, device=None, max_position: int | None = None):
        super().__init__(cfg)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        theta, scaling = rope_params(cfg)
        self.rotary = Rotary(rope_table(head_dim, max_position or cfg.max_position_embeddings,
                                        theta, scaling, device))
        self.windows = layer_windows(cfg)
        for i in range(cfg.num_hidden_layers):
            attn = PagedAttention(cfg, i, self.rotary, qk_norm=self.qk_norm,
                                  sliding_window=self.windows[i])
            self.layers.append(DecoderLayer(cfg, attn, self.make_mlp(cfg, i)))

    def make_mlp(self, cfg, layer_id: int):
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=mlp_activation(cfg))

    def kv_cache_spec(self) -> GQACacheSpec:
        """What one layer's paged cache holds per token (the runner allocates it)."""
        a = self.layers[0].self_attn
        return GQACacheSpec(num_layers=len(self.layers), num_kv_heads=a.num_kv_heads,
                            head_dim=a.head_dim)


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense: Llama plus a per-head RMSNorm on q and k before RoPE."""

    qk_norm = True


@register_model("MistralForCausalLM")
class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with every layer attending to its last `sliding_window` keys (when set)."""
