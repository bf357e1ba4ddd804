"""Qwen3-MoE: Qwen3 attention (q/k norm) with softmax top-k routed experts on the sparse layers."""
from __future__ import annotations

from .layers import GatedMLP, SoftmaxMoE
from .llama import Qwen3ForCausalLM
from .registry import register_model


@register_model("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, cfg, layer_id: int):
        step = getattr(cfg, "decoder_sparse_step", 1) or 1
        sparse = (layer_id not in (getattr(cfg, "mlp_only_layers", None) or [])
                  and cfg.num_experts > 0 and (layer_id + 1) % step == 0)
        if not sparse:
            return GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        return SoftmaxMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                          cfg.num_experts_per_tok, bool(getattr(cfg, "norm_topk_prob", True)))
