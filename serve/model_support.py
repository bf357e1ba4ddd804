"""Which config fields change a model's math, and what the serving model code does with each.

A checkpoint must never be served with math other than its own: `check_model_config(cfg)` runs
at load (serve.config.load_model_config) and refuses, naming every offending field, any config
that asks for something the model code does not compute. The reference for "the math" of an
architecture is HF transformers' modeling code for it: a field that code does not read (e.g.
`sliding_window` on a Llama config, training-only fields such as dropout or router aux loss)
changes nothing and is ignored, as HF ignores it.

`SUPPORT_TABLE` is the explicit list, one row per (architectures, field): what is supported and
a check that returns None when the config is served exactly, or the reason it is not. The
table is printed by `python -m serve.model_support` and tested row by row
(tests/serve/test_model_support.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

LLAMA, QWEN3, QWEN3_MOE, MISTRAL, DSV3 = ("LlamaForCausalLM", "Qwen3ForCausalLM",
                                          "Qwen3MoeForCausalLM", "MistralForCausalLM",
                                          "DeepseekV3ForCausalLM")
GQA_ARCHS = (LLAMA, QWEN3, QWEN3_MOE, MISTRAL)
ALL_ARCHS = GQA_ARCHS + (DSV3,)
MOE_ARCHS = (QWEN3_MOE, DSV3)

# HF activation names -> the gated MLP kernel that computes them. "gelu_new" and "gelu_fast"
# are the same tanh formula as "gelu_pytorch_tanh" (HF NewGELU / FastGELU).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedConfigError(ValueError):
    """The config asks for math the serving model code does not do (lists every field)."""


def _get(cfg, name, default=None):
    v = getattr(cfg, name, default)
    return default if v is None else v


# ---- checks: None when served exactly, else why not -------------------------------------------
def _hidden_act(cfg):
    act = _get(cfg, "hidden_act", "silu")
    arch = architecture(cfg)
    if act not in ACTIVATIONS:
        return f"{act!r} is not implemented (supported: {sorted(ACTIVATIONS)})"
    if arch in MOE_ARCHS and ACTIVATIONS[act] != "silu":
        return f"{act!r}: the fused MoE experts compute SiLU only"
    return None


def _rope(cfg):
    from .config import rope_params
    _, scaling = rope_params(cfg)
    kind = (scaling or {}).get("rope_type", "default")
    if kind not in ROPE_TYPES:
        return f"rope type {kind!r} is not implemented (supported: {list(ROPE_TYPES)})"
    return None


def _partial_rotary(cfg):
    rp = dict(_get(cfg, "rope_parameters", {}) or {})
    f = rp.get("partial_rotary_factor", _get(cfg, "partial_rotary_factor", 1.0))
    return None if float(f) == 1.0 else f"partial rotary ({f}) is not implemented"


def _kv_heads(cfg):
    h, kv = cfg.num_attention_heads, _get(cfg, "num_key_value_heads", cfg.num_attention_heads)
    return None if kv > 0 and h % kv == 0 else f"{h} query heads are not a multiple of {kv} KV heads"


def _false(name, why):
    def check(cfg):
        return None if not _get(cfg, name, False) else f"{name}=True: {why}"
    return check


def _absent(name, why):
    def check(cfg):
        v = getattr(cfg, name, None)
        return None if v in (None, {}, []) else f"{name}={v!r}: {why}"
    return check


def _block_fp8(cfg):
    """Unquantized, or DeepSeek-V3-style block fp8 (what moe.fused_experts and
    gemm.fp8_block_mm compute); anything else would be served with other math."""
    qc = getattr(cfg, "quantization_config", None)
    if qc in (None, {}, []):
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    bad = f"quantization_config={qc!r}: only block fp8 is supported"
    if qc.get("quant_method") != "fp8" or list(qc.get("weight_block_size") or []) != [128, 128]:
        return bad + " (quant_method 'fp8' with weight_block_size [128, 128])"
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        return bad + " (dynamic per-token-group activation scales)"
    if qc.get("fmt", "e4m3") != "e4m3":
        return bad + " (e4m3 weights)"
    return None


def _layer_types(cfg):
    try:
        layer_windows(cfg)
    except UnsupportedConfigError as e:
        return str(e)
    return None


def _moe_layer_freq(cfg):
    f = _get(cfg, "moe_layer_freq", 1)
    return None if f == 1 else f"moe_layer_freq={f} (every layer after the dense ones is MoE here)"


def _ok(cfg):
    return None


@dataclass(frozen=True)
class Rule:
    archs: tuple[str, ...]
    field: str
    supported: str            # what the model code computes for this field
    check: Callable[[object], str | None]


SUPPORT_TABLE: tuple[Rule, ...] = (
    Rule(ALL_ARCHS, "hidden_act", "silu / swish (SwiGLU); gelu_pytorch_tanh / gelu_new / "
         "gelu_fast (GeGLU, tanh) on dense MLPs only", _hidden_act),
    Rule(ALL_ARCHS, "rope_scaling / rope_parameters.rope_type", "default, linear, llama3, yarn; "
         "others (dynamic, longrope, ...) refused", _rope),
    Rule(ALL_ARCHS, "partial_rotary_factor", "1.0 only", _partial_rotary),
    Rule(ALL_ARCHS, "rope_theta", "any", _ok),
    Rule(ALL_ARCHS, "tie_word_embeddings", "True / False", _ok),
    Rule(ALL_ARCHS, "quantization_config", "none, or block fp8 (quant_method fp8, e4m3, "
         "weight_block_size [128, 128], dynamic activations: weight_scale_inv checkpoints)",
         _block_fp8),
    Rule(GQA_ARCHS, "num_key_value_heads", "any divisor of num_attention_heads (GQA / MQA)",
         _kv_heads),
    Rule(GQA_ARCHS, "head_dim", "any (default hidden_size / heads)", _ok),
    Rule((LLAMA, QWEN3, QWEN3_MOE), "attention_bias", "True / False (q, k, v and o)", _ok),
    Rule((LLAMA,), "mlp_bias", "False", _false("mlp_bias", "biased MLP projections are not "
                                                "implemented")),
    Rule((QWEN3, QWEN3_MOE), "qk_norm (architecture)", "per-head RMSNorm on q and k before RoPE",
         _ok),
    Rule((QWEN3,), "use_sliding_window / sliding_window / max_window_layers / layer_types",
         "per-layer windows as HF computes them (full and sliding layers may alternate)",
         _layer_types),
    Rule((QWEN3_MOE,), "use_sliding_window / sliding_window", "every layer windowed when set",
         _layer_types),
    Rule((MISTRAL,), "sliding_window", "every layer windowed when set; layer_types refused",
         _layer_types),
    Rule((LLAMA,), "sliding_window / layer_types", "not read by HF Llama: ignored", _ok),
    Rule((QWEN3_MOE,), "num_experts / num_experts_per_tok / moe_intermediate_size / "
         "decoder_sparse_step / mlp_only_layers / norm_topk_prob", "as HF", _ok),
    Rule((DSV3,), "attention_bias", "False", _false("attention_bias", "biased MLA projections "
                                                     "are not implemented")),
    Rule((DSV3,), "moe_layer_freq", "1", _moe_layer_freq),
    Rule((DSV3,), "q_lora_rank / kv_lora_rank / qk_*_head_dim / v_head_dim / rope_interleave",
         "any (absorbed MLA)", _ok),
    Rule((DSV3,), "n_group / topk_group / routed_scaling_factor / norm_topk_prob / "
         "first_k_dense_replace / n_shared_experts", "as HF (sigmoid grouped routing)", _ok),
)


def architecture(cfg) -> str | None:
    for arch in _get(cfg, "architectures", []) or []:
        if arch in ALL_ARCHS:
            return arch
    return None


def problems(cfg) -> list[str]:
    """'field: reason' for every rule of the config's architecture that it breaks."""
    arch = architecture(cfg)
    out = []
    for rule in SUPPORT_TABLE:
        if arch in rule.archs:
            why = rule.check(cfg)
            if why is not None:
                out.append(f"{rule.field}: {why}")
    return out


def check_model_config(cfg) -> None:
    """Raises UnsupportedConfigError naming every field the model code would get wrong.
    Configs of architectures not served are left to the model lookup (which names them)."""
    if architecture(cfg) is None:
        return
    found = problems(cfg)
    if found:
        raise UnsupportedConfigError(
            f"model: this {architecture(cfg)} config asks for math the serving code does not "
            "implement, so it is refused rather than served wrong: " + "; ".join(found))


def mlp_activation(cfg) -> str:
    """'silu' or 'gelu_tanh': the gated MLP's activation kernel for this config."""
    return ACTIVATIONS[_get(cfg, "hidden_act", "silu")]


def layer_windows(cfg) -> list[int | None]:
    """Per layer: the sliding window W (attend to the last W keys, the query's own included)
    or None (full attention), exactly as HF's modeling code of the architecture decides."""
    arch = architecture(cfg)
    n = cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    if arch in (QWEN3, QWEN3_MOE) and not _get(cfg, "use_sliding_window", False):
        window = None   # transformers 4.x configs keep the value; HF's modeling ignores it
    if arch == QWEN3:
        # HF Qwen3: sliding_window is None unless use_sliding_window; layer_types defaults to
        # "sliding_attention" for layers >= max_window_layers when there is a window
        types = getattr(cfg, "layer_types", None)
        if types is None:
            lo = _get(cfg, "max_window_layers", 0)
            types = ["sliding_attention" if window is not None and i >= lo else "full_attention"
                     for i in range(n)]
        return _from_layer_types(types, window, n)
    if arch in (QWEN3_MOE, MISTRAL):
        if getattr(cfg, "layer_types", None) is not None and arch == MISTRAL:
            raise UnsupportedConfigError("layer_types on a Mistral config (HF warns and ignores "
                                         "alternation there; use a Ministral checkpoint)")
        return [_window(window)] * n
    return [None] * n


def _window(w) -> int | None:
    if w is None:
        return None
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise UnsupportedConfigError(f"sliding_window={w!r} is not a positive int")
    return w


def _from_layer_types(types, window, n: int) -> list[int | None]:
    types = list(types)
    if len(types) != n:
        raise UnsupportedConfigError(f"layer_types has {len(types)} entries for {n} layers")
    bad = sorted({t for t in types if t not in LAYER_TYPES})
    if bad:
        raise UnsupportedConfigError(f"layer_types {bad} are not implemented "
                                     f"(supported: {list(LAYER_TYPES)})")
    if "sliding_attention" in types and window is None:
        raise UnsupportedConfigError("layer_types names sliding_attention layers but "
                                     "sliding_window is None (use_sliding_window is off)")
    w = _window(window)
    return [w if t == "sliding_attention" else None for t in types]


def support_table_markdown() -> str:
    rows = ["| architectures | field | supported |", "|---|---|---|"]
    for r in SUPPORT_TABLE:
        archs = "all" if r.archs == ALL_ARCHS else ", ".join(a.removesuffix("ForCausalLM")
                                                             for a in r.archs)
        rows.append(f"| {archs} | `{r.field}` | {r.supported} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(support_table_markdown())
