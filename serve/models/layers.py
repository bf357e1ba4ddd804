"""Building blocks shared by the models. Every computation goes through a `tskernels` op; the
glue here is views, splits, residual adds and index lookups.

Weights follow the HF checkpoint names; fused projections (q|k|v, gate|up, stacked experts)
carry a `shards` map so that the loader can copy each HF tensor into its rows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tskernels

from . import bound_ops as ops
from . import quant


FP8 = torch.float8_e4m3fn


# serve.weights.build_model sets this while it instantiates a model: weights are then made on
# the meta device and materialized once, in their final dtype, so building never holds a
# float32 copy of the model (a 30B model's 122 GB) on the card.
META_PARAMS = False


def _param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    """A weight; `dtype` pins it (fp8 weights, their float32 scales) where the model's dtype
    would otherwise be applied at build time (serve.weights.build_model)."""
    kw = dict(device="meta") if META_PARAMS else {}
    p = nn.Parameter(torch.empty(*shape, dtype=dtype or torch.float32, **kw),
                     requires_grad=False)
    if dtype is not None:
        p.fixed_dtype = dtype
    return p


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _dequant_blocks(w: torch.Tensor, scale: torch.Tensor, block: int, dtype) -> torch.Tensor:
    """[..., N, K] e4m3 with [..., ceil(N/b), ceil(K/b)] scales -> dtype (load-time glue)."""
    n, k = w.shape[-2:]
    s = scale.repeat_interleave(block, -2)[..., :n, :].repeat_interleave(block, -1)[..., :k]
    return (w.float() * s).to(dtype)


class Linear(nn.Module):
    """y = x @ W.T (+ b). W [out, in] in the nn.Linear layout. `shards` names the HF tensors
    stacked along the output rows: {suffix: (row_offset, rows)}."""

    def __init__(self, in_features: int, out_features: int | list[int],
                 shard_names: list[str] | None = None, bias: bool = False):
        super().__init__()
        outs = [out_features] if isinstance(out_features, int) else list(out_features)
        self.weight = _param(sum(outs), in_features)
        self.bias = _param(sum(outs)) if bias else None
        self.weight_scale_inv = None  # float32 block scales once `to_fp8` ran
        self.block = 0
        self.int8 = None  # (int8 weight, float32 row scales) once quant.quantize_int8 ran
        self.q4 = None  # (packed 4-bit weight, scales, mins) once quant.quantize_int4 ran
        self.shards: dict[str, tuple[int, int]] = {}
        if shard_names:
            off = 0
            for name, n in zip(shard_names, outs):
                self.shards[name] = (off, n)
                off += n

    def to_fp8(self, block: int) -> None:
        """Block-fp8 weights in the HF fp8 layout: weight e4m3 [out, in], weight_scale_inv
        float32 [ceil(out/block), ceil(in/block)] (dequant = weight * scale per block). forward
        then quantizes x per 1 x block group and runs gemm.fp8_block_mm."""
        n, k = self.weight.shape
        for name, (off, rows) in self.shards.items():
            if off % block or (rows % block and off + rows != n):
                raise ValueError(f"fp8 weights: shard {name} (rows {off}..{off + rows}) of a "
                                 f"fused projection does not fall on {block}-row scale blocks")
        self.weight = _param(n, k, dtype=FP8)
        self.weight_scale_inv = _param(_cdiv(n, block), _cdiv(k, block), dtype=torch.float32)
        self.block = block

    def plain(self) -> bool:
        """A dense 16/32-bit weight and no bias: what the fused decode gemvs take."""
        return (self.weight_scale_inv is None and self.int8 is None and self.q4 is None and
                self.bias is None)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype` (dequantized when fp8), for load-time transforms."""
        if self.weight_scale_inv is None:
            return self.weight.to(dtype)
        return _dequant_blocks(self.weight, self.weight_scale_inv, self.block, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_scale_inv is not None:
            x2 = x.reshape(-1, x.shape[-1])
            q, s = tskernels.gemm.quantize_fp8_per_token_group(x2, self.block)
            y = tskernels.gemm.fp8_block_mm(q, s, self.weight, self.weight_scale_inv,
                                            out_dtype=x.dtype, block=self.block)
            y = y.view(*x.shape[:-1], y.shape[-1])
        elif self.int8 is not None:
            y = quant.int8w_mm(x, *self.int8)
        elif self.q4 is not None:
            y = quant.q4w_mm(x, *self.q4)
        else:
            y = ops.mm(x, self.weight)
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = _param(dim)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """rmsnorm(x), or (rmsnorm(x + residual), x + residual) when a residual is given."""
        if residual is None:
            return ops.rmsnorm(x, self.weight, self.eps)
        return ops.fused_add_rmsnorm(x, residual, self.weight, self.eps)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.weight = _param(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate|up fused into one GEMM; act "silu" (SwiGLU) or
    "gelu_tanh" (GeGLU, tanh approximation; serve.model_support.mlp_activation maps HF names)."""

    def __init__(self, hidden: int, inter: int, act: str = "silu"):
        super().__init__()
        if act not in ("silu", "gelu_tanh"):
            raise ValueError(f"act: expected 'silu' or 'gelu_tanh', got {act!r}")
        self.gate_up_proj = Linear(hidden, [inter, inter], ["gate_proj", "up_proj"])
        self.down_proj = Linear(inter, hidden)
        self._act = ops.silu_and_mul if act == "silu" else ops.gelu_tanh_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self._act(self.gate_up_proj(x)))

    def fusable(self) -> bool:
        return (self._act is ops.silu_and_mul and self.gate_up_proj.plain() and
                self.down_proj.plain())

    def fused_forward(self, h: torch.Tensor, norm: "RMSNorm") -> torch.Tensor:
        """The residual stream after this block: h + down(silu_mul(gate_up(norm(h)))), norm
        and activation fused into the gemvs, the residual add into down's epilogue."""
        gu = ops.rmsnorm_gemv(h, norm.weight, norm.eps, self.gate_up_proj.weight)
        return ops.silu_mul_gemv(gu, self.down_proj.weight, h)


class Experts(nn.Module):
    """E experts' SwiGLU weights stacked: w13 [E, 2I, H] (gate rows, then up), w2 [E, H, I];
    after `to_fp8`, e4m3 with float32 block scales w13_scale_inv [E, 2I/b, ceil(H/b)] and
    w2_scale_inv [E, ceil(H/b), I/b] (each HF expert's weight_scale_inv stacked)."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.num_experts, self.inter, self.hidden = num_experts, inter, hidden
        self.w13 = _param(num_experts, 2 * inter, hidden)
        self.w2 = _param(num_experts, hidden, inter)
        self.w13_scale_inv = self.w2_scale_inv = None
        self.block = 0

    def to_fp8(self, block: int) -> None:
        if self.inter % block:
            raise ValueError(f"fp8 experts: moe_intermediate_size {self.inter} is not a "
                             f"multiple of the {block}-wide scale blocks")
        e, h, i = self.num_experts, self.hidden, self.inter
        self.w13, self.w2 = _param(e, 2 * i, h, dtype=FP8), _param(e, h, i, dtype=FP8)
        self.w13_scale_inv = _param(e, 2 * i // block, _cdiv(h, block), dtype=torch.float32)
        self.w2_scale_inv = _param(e, _cdiv(h, block), i // block, dtype=torch.float32)
        self.block = block

    def forward(self, x, weights, ids):
        if self.w13_scale_inv is not None:
            return tskernels.moe.fused_experts(x, self.w13, self.w2, weights, ids,
                                               w13_scale=self.w13_scale_inv,
                                               w2_scale=self.w2_scale_inv)
        return tskernels.moe.fused_experts(x, self.w13, self.w2, weights, ids)


class SoftmaxMoE(nn.Module):
    """Qwen3-MoE / Mixtral block: softmax top-k router, then the fused experts."""

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int, renormalize: bool):
        super().__init__()
        self.gate = Linear(hidden, num_experts)
        self.experts = Experts(num_experts, hidden, inter)
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        w, ids = tskernels.moe.topk_softmax(logits, self.top_k, renormalize=self.renormalize)
        return self.experts(x, w, ids)

    def fuses_route(self, x: torch.Tensor) -> bool:
        return ops.fuse_moe_router(x, self.gate)

    def fused_route(self, x: torch.Tensor, residual: torch.Tensor | None, norm: "RMSNorm"):
        """(experts(norm(x + residual)), x + residual) with the add, the norm, the router and
        the routing in one op (residual None: x is the whole stream)."""
        y, r, w, ids = tskernels.moe.rmsnorm_router_topk_softmax(
            x, norm.weight, self.gate.weight, self.top_k, residual=residual, eps=norm.eps,
            renormalize=self.renormalize)
        return self.experts(y, w, ids), (x if r is None else r)


class Rotary:
    """A cos/sin table [max_position, rotary_dim] and its application to q, k [T, H, D]."""

    def __init__(self, table: torch.Tensor, style: str = "neox"):
        self.table, self.style = table, style

    def __call__(self, q, k, positions):
        return ops.apply_rope(q, k, positions, self.table, style=self.style)


def rope_table(head_dim: int, max_position: int, theta: float, scaling: dict | None,
               device) -> torch.Tensor:
    kind = (scaling or {}).get("rope_type")
    if kind in (None, "default", "linear", "llama3", "yarn"):
        return tskernels.rope.cos_sin_cache(max_position, head_dim, theta, scaling=scaling,
                                            device=device)
    raise ValueError(f"rope scaling {kind!r} is not supported")


class PagedAttention(nn.Module):
    """GQA self-attention over the paged KV cache: fused qkv projection, optional per-head q/k
    RMSNorm (Qwen3), RoPE, store the new K/V, then the step's attention plan."""

    def __init__(self, cfg, layer_id: int, rotary: Rotary, qk_norm: bool = False,
                 sliding_window: int | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.sliding_window = sliding_window  # attend to the last W keys only (None: all)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = bool(getattr(cfg, "attention_bias", False))
        self.qkv_proj = Linear(cfg.hidden_size, [q, kv, kv], ["q_proj", "k_proj", "v_proj"],
                               bias=bias)
        self.o_proj = Linear(q, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.rotary = rotary
        self.split = [q, kv, kv]

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        return self.o_proj(self.attend(self.qkv_proj(x), batch))

    def fusable(self) -> bool:
        return self.qkv_proj.plain() and self.o_proj.plain()

    def fused_forward(self, h: torch.Tensor, norm: "RMSNorm", batch) -> torch.Tensor:
        """The residual stream after this block: h + o(attn(qkv(norm(h)))), the norm fused
        into the qkv gemv and the residual add into o's epilogue."""
        qkv = ops.rmsnorm_gemv(h, norm.weight, norm.eps, self.qkv_proj.weight)
        return ops.gemv_residual(self.attend(qkv, batch), self.o_proj.weight, h)

    def attend(self, qkv: torch.Tensor, batch) -> torch.Tensor:
        """Attention output [T, heads * head_dim] of the q|k|v projection [T, q + 2 kv]."""
        t = qkv.shape[0]
        q, k, v = qkv.split(self.split, dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        att = batch.attention
        if att.fuse_rope_store:  # decode-only step on a GPU: norm + RoPE + store, one launch
            qn, kn = self.q_norm, self.k_norm
            o = att.forward_rope_store(
                self.layer_id, q, k, v, batch.positions, self.rotary.table,
                style=self.rotary.style, q_norm_weight=None if qn is None else qn.weight,
                k_norm_weight=None if kn is None else kn.weight,
                eps=1e-6 if qn is None else qn.eps, sliding_window=self.sliding_window)
            return o.view(t, -1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(q, k, batch.positions)
        o = batch.attention.forward(self.layer_id, q, k, v, sliding_window=self.sliding_window)
        return o.view(t, -1)


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual add is fused into the next norm (fused_add_rmsnorm).

    Decode rows on a GPU (bound_ops.fuse_decode) take the fused form per half where the
    sub-block allows it (`fusable`: plain 16-bit weights, SiLU MLP): the norm runs inside the
    next gemv and the residual add in the gemv's epilogue, so the half returns the whole
    residual stream (x, None). (x, residual) always means "the stream is x + residual"."""

    def __init__(self, cfg, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, batch):
        attn, mlp = self.self_attn, self.mlp
        fuse_attn = getattr(attn, "fusable", None) is not None and \
            ops.fuse_decode(x, attn.qkv_proj.weight) and attn.fusable()
        if fuse_attn:
            h = x if residual is None else x + residual  # fused_add_rmsnorm's sum, one rounding
            x, residual = attn.fused_forward(h, self.input_layernorm, batch), None
        else:
            if residual is None:
                residual, x = x, self.input_layernorm(x)
            else:
                x, residual = self.input_layernorm(x, residual)
            x = attn(x, batch)
        if getattr(mlp, "fusable", None) is not None and \
                ops.fuse_decode(x, mlp.gate_up_proj.weight) and mlp.fusable():
            return mlp.fused_forward(x if residual is None else x + residual,
                                     self.post_attention_layernorm), None
        if getattr(mlp, "fuses_route", None) is not None and mlp.fuses_route(x):
            return mlp.fused_route(x, residual, self.post_attention_layernorm)
        if residual is None:
            residual, x = x, self.post_attention_layernorm(x)
        else:
            x, residual = self.post_attention_layernorm(x, residual)
        if getattr(mlp, "fusable", None) is not None and \
                ops.fuse_silu_down(x, mlp.gate_up_proj.weight) and mlp.fusable():
            # down(silu_mul(gate_up(x))) + residual: the whole stream, one launch less
            return ops.silu_mul_gemv(mlp.gate_up_proj(x), mlp.down_proj.weight, residual), None
        return mlp(x), residual


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm; `compute_logits` runs the LM head on the
    rows that sample only. Subclasses build `self.layers` and describe their KV cache."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.tie = bool(getattr(cfg, "tie_word_embeddings", False))
        self.lm_head = None if self.tie else Linear(cfg.hidden_size, cfg.vocab_size)
        self.layers = nn.ModuleList()

    def forward(self, input_ids: torch.Tensor, batch) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, batch)
        if residual is None:  # the last layer ran fused: x is the whole residual stream
            return self.norm(x)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if getattr(self, "int8_lm_head", None) is not None:  # tied, weight-only int8
            return quant.int8w_mm(hidden, *self.int8_lm_head, out_dtype=torch.float32)
        if not self.tie and self.lm_head.int8 is not None:
            return quant.int8w_mm(hidden, *self.lm_head.int8, out_dtype=torch.float32)
        w = self.embed_tokens.weight if self.tie else self.lm_head.weight
        return ops.mm(hidden, w, out_dtype=torch.float32)

    # ---- weight names: HF checkpoint name -> (parameter, row offset, rows) -------------------
    def hf_weight_map(self) -> dict[str, tuple]:
        """Every HF tensor name this model reads -> (param, expert, row offset, rows): the
        destination is param[expert][offset:offset + rows], None meaning "all of it"."""
        out = {}
        for mod_name, mod in self.named_modules():
            prefix = f"model.{mod_name}." if mod_name and not mod_name.startswith("lm_head") \
                else f"{mod_name}."
            if isinstance(mod, Linear):
                parent = prefix.rsplit(".", 2)[0] + "." if mod.shards else prefix
                sc, b = mod.weight_scale_inv, mod.block
                for name, (off, n) in mod.shards.items():
                    out[f"{parent}{name}.weight"] = (mod.weight, None, off, n)
                    if mod.bias is not None:
                        out[f"{parent}{name}.bias"] = (mod.bias, None, off, n)
                    if sc is not None:
                        out[f"{parent}{name}.weight_scale_inv"] = (sc, None, off // b,
                                                                   _cdiv(n, b))
                if not mod.shards:
                    out[f"{prefix}weight"] = (mod.weight, None, None, None)
                    if mod.bias is not None:
                        out[f"{prefix}bias"] = (mod.bias, None, None, None)
                    if sc is not None:
                        out[f"{prefix}weight_scale_inv"] = (sc, None, None, None)
            elif isinstance(mod, Experts):
                for e in range(mod.num_experts):
                    i = mod.inter
                    out[f"{prefix}{e}.gate_proj.weight"] = (mod.w13, e, 0, i)
                    out[f"{prefix}{e}.up_proj.weight"] = (mod.w13, e, i, i)
                    out[f"{prefix}{e}.down_proj.weight"] = (mod.w2, e, None, None)
                    if mod.w13_scale_inv is not None:
                        r = i // mod.block
                        out[f"{prefix}{e}.gate_proj.weight_scale_inv"] = (mod.w13_scale_inv, e,
                                                                          0, r)
                        out[f"{prefix}{e}.up_proj.weight_scale_inv"] = (mod.w13_scale_inv, e,
                                                                        r, r)
                        out[f"{prefix}{e}.down_proj.weight_scale_inv"] = (mod.w2_scale_inv, e,
                                                                          None, None)
                out[f"{prefix}gate_up_proj"] = (mod.w13, None, None, None)  # transformers 5
                out[f"{prefix}down_proj"] = (mod.w2, None, None, None)
            elif isinstance(mod, (RMSNorm, Embedding)):
                out[f"{prefix}weight"] = (mod.weight, None, None, None)
        return out
