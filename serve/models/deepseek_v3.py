"""DeepSeek-V3 / Kimi-K2: multi-head latent attention (absorbed, 512+64 latent cache) and MoE
with sigmoid grouped routing, shared experts, and dense first layers.

Absorbed MLA: per head h, with W_UK[h] [nope, kv_lora] and W_UV[h] [v, kv_lora] taken from
kv_b_proj, the query becomes q_lat = q_nope @ W_UK[h] (512) ++ rope(q_pe) (64), the cache keeps
one row per token, c_kv (512, after kv_a_layernorm) ++ rope(k_pe) (64), shared by all heads, and
the output is (softmax(q_lat . rows) @ c_kv) @ W_UV[h]^T. Logits equal the unabsorbed
q_nope . k_nope + q_pe . k_pe, so the softmax scale stays 1/sqrt(nope + rope) (x mscale^2).
"""
from __future__ import annotations

import torch
from torch import nn

import tskernels

from ..config import mla_softmax_scale, rope_params
from . import bound_ops as ops
from .registry import register_model
from .layers import (
    CausalLM,
    DecoderLayer,
    Experts,
    GatedMLP,
    Linear,
    RMSNorm,
    Rotary,
    _param,
    rope_table,
)


class MLAttention(nn.Module):
    def __init__(self, cfg, layer_id: int, rotary: Rotary):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_attention_heads
        self.nope, self.rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.v_dim, self.kv_lora = cfg.v_head_dim, cfg.kv_lora_rank
        qk = self.nope + self.rope
        self.q_lora = getattr(cfg, "q_lora_rank", None)
        if self.q_lora:
            self.q_a_proj = Linear(cfg.hidden_size, self.q_lora)
            self.q_a_layernorm = RMSNorm(self.q_lora, 1e-6)
            self.q_b_proj = Linear(self.q_lora, self.num_heads * qk)
        else:
            self.q_proj = Linear(cfg.hidden_size, self.num_heads * qk)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, self.kv_lora + self.rope)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, 1e-6)
        self.kv_b_proj = Linear(self.kv_lora, self.num_heads * (self.nope + self.v_dim))
        self.kv_b_proj.keep_dense = True      # absorbed into the MLA weights from its float copy
        self.o_proj = Linear(self.num_heads * self.v_dim, cfg.hidden_size)
        self.rotary = rotary
        self.scale = mla_softmax_scale(cfg)
        self.w_uk = self.w_uv = None  # [H, nope, kv_lora], [H, v, kv_lora] after loading

    def absorb(self) -> None:
        """Split kv_b_proj into the per-head W_UK and W_UV used by the absorbed form."""
        # the model's activation dtype (norm weights are never fp8)
        w = self.kv_b_proj.dense_weight(self.kv_a_layernorm.weight.dtype)
        w = w.view(self.num_heads, self.nope + self.v_dim, self.kv_lora)
        self.w_uk = w[:, :self.nope].contiguous()
        self.w_uv = w[:, self.nope:].contiguous()

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        t, h = x.shape[0], self.num_heads
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(t, h, self.nope + self.rope)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[:, :self.kv_lora])
        # DeepSeek's rotary dims are interleaved pairs: the gptj pairing, on q and k alike.
        q_pe, k_pe = self.rotary(q[:, :, self.nope:], kv[:, None, self.kv_lora:],
                                 batch.positions)
        # Per-head absorption [H, T, nope] x [H, nope, kv_lora]: a batched GEMM (no op family).
        q_abs = torch.bmm(q[:, :, :self.nope].transpose(0, 1), self.w_uk)
        q_lat = torch.cat([q_abs.transpose(0, 1), q_pe], dim=-1)
        latent = torch.cat([c_kv, k_pe[:, 0]], dim=-1)
        o_lat = batch.attention.forward_mla(self.layer_id, q_lat, latent)
        o = torch.bmm(o_lat.transpose(0, 1), self.w_uv.transpose(1, 2))  # [H, T, v]
        return self.o_proj(o.transpose(0, 1).reshape(t, h * self.v_dim))


class SigmoidGroupedMoE(nn.Module):
    """Routed experts chosen by sigmoid scores + correction bias within the best groups,
    plus always-on shared experts."""

    def __init__(self, cfg):
        super().__init__()
        e = cfg.n_routed_experts
        self.gate = Linear(cfg.hidden_size, e)
        self.gate.keep_dense = True           # fp32 router logits read gate.weight directly
        self.e_score_correction_bias = _param(e)
        self.experts = Experts(e, cfg.hidden_size, cfg.moe_intermediate_size)
        shared = cfg.moe_intermediate_size * (cfg.n_shared_experts or 0)
        self.shared_experts = GatedMLP(cfg.hidden_size, shared) if shared else None
        self.top_k, self.n_group, self.topk_group = (cfg.num_experts_per_tok, cfg.n_group,
                                                     cfg.topk_group)
        self.scaling = float(cfg.routed_scaling_factor)
        self.renormalize = bool(getattr(cfg, "norm_topk_prob", True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The router runs in fp32 (DeepSeek keeps gate weights and bias in fp32).
        logits = ops.mm(x.float(), self.gate.weight)
        w, ids = tskernels.moe.topk_sigmoid_grouped(
            logits, self.e_score_correction_bias, self.top_k, n_group=self.n_group,
            topk_group=self.topk_group, routed_scaling_factor=self.scaling,
            renormalize=self.renormalize)
        out = self.experts(x, w, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


@register_model("DeepseekV3ForCausalLM")
class DeepseekV3ForCausalLM(CausalLM):
    fp32_params = ("gate.weight", "e_score_correction_bias")

    def __init__(self, cfg, device=None, max_position: int | None = None):
        super().__init__(cfg)
        theta, scaling = rope_params(cfg)
        table = rope_table(cfg.qk_rope_head_dim, max_position or cfg.max_position_embeddings,
                           theta, scaling, device)
        style = "gptj" if getattr(cfg, "rope_interleave", True) else "neox"
        self.rotary = Rotary(table, style)
        dense = getattr(cfg, "first_k_dense_replace", 0) or 0
        for i in range(cfg.num_hidden_layers):
            mlp = (GatedMLP(cfg.hidden_size, cfg.intermediate_size) if i < dense
                   else SigmoidGroupedMoE(cfg))
            self.layers.append(DecoderLayer(cfg, MLAttention(cfg, i, self.rotary), mlp))

    def kv_cache_spec(self) -> tskernels.MLACacheSpec:
        a = self.layers[0].self_attn
        return tskernels.MLACacheSpec(num_layers=len(self.layers), kv_lora_rank=a.kv_lora,
                                      rope_dim=a.rope)

    def post_load(self) -> None:
        for layer in self.layers:
            layer.self_attn.absorb()

    def hf_weight_map(self):
        out = super().hf_weight_map()
        for i, layer in enumerate(self.layers):
            if isinstance(layer.mlp, SigmoidGroupedMoE):
                out[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = (
                    layer.mlp.e_score_correction_bias, None, None, None)
        return out
