"""Engine arguments, model configs (HF directory, named dummy shapes, JSON files), RoPE tables.

A model config is a transformers `PretrainedConfig` (config objects only: the forward path never
touches a transformers module). `load_model_config(model)` accepts:
    "default"               the embedded SmolLM2-135M-Instruct (see serve.default_model)
    "/path/to/hf_dir"       a local HF checkpoint directory (config.json + safetensors)
    "dummy:<name>"          a named config from DUMMY_CONFIGS, random weights
    "dummy:/path/cfg.json"  any HF config.json, random weights
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

import torch

import tskernels

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")


@dataclass
class EngineArgs:
    """Engine knobs (vLLM names). None means "pick from the model and the device"."""

    max_model_len: int | None = None
    max_num_seqs: int = 256
    chunked_prefill_size: int | None = None  # per-step token budget (decodes + prefill chunks)
    page_size: int | None = None  # None: 64 on a GPU, 16 on the CPU (default_page_size)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.85
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    # weight-only quantization: "auto" (int8 on the CPU when dtype is "auto"), "none", "int8",
    # "int4" (4-bit groups of 32, int8 logits projection; CPU only)
    quantization: str = "auto"
    seed: int = 0
    device: str = "auto"
    num_kv_pages: int | None = None  # explicit pool size (pages, excluding the null page 0)
    cuda_graphs: bool = True
    # CPU decode steps recorded once per batch size (<= 16 rows) and replayed in C++
    # (serve.cpu_graph); off: every step runs the Python forward
    cpu_graphs: bool = True
    # the host prepares step N+1 while the device runs step N (Engine.step); None: on a GPU
    # (on the CPU a step computes while it is launched: nothing to overlap)
    overlap_schedule: bool | None = None
    # with overlap: launch a greedy decode step's successor before its ids are back (the
    # scheduler's next plan is checked against it; serve.model_runner.Lookahead). It also sets
    # the scheduler's decode_reserve_tokens to 1: each decode row's next KV page is taken one
    # step early when one is free or evictable, so a row opening a page does not block it.
    # None: on wherever overlap scheduling is (a GPU)
    overlap_lookahead: bool | None = None
    cpu_kv_cache_gb: float = 1.0  # default pool size on CPU when num_kv_pages is not given
    threads: int | None = None  # torch.set_num_threads for the engine; None: torch's default
    # autotune (docs/AUTOTUNE.md): count the (kernel, shape bucket) lookups of the traffic into
    # this file; with tune_window_s > 0, at start (before CUDA graphs) tune for at most that
    # many seconds the file's buckets that have no table entry, kept for the next start
    capture_shapes: str | None = None
    tune_window_s: float = 0.0

    def __post_init__(self):
        def bad(name, want):
            raise ValueError(f"{name}: expected {want}, got {getattr(self, name)!r}")
        for name in ("max_model_len", "chunked_prefill_size", "num_kv_pages"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                bad(name, "a positive int or None")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            bad("max_num_seqs", "a positive int")
        if self.page_size is not None and self.page_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            bad("page_size", "a power of two in 1..256")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            bad("kv_cache_dtype", f"one of {KV_CACHE_DTYPES}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            bad("dtype", f"'auto' or one of {sorted(DTYPES)}")
        if self.quantization not in ("auto", "none", "int8", "int4"):
            bad("quantization", "'auto', 'none', 'int8' or 'int4'")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            bad("threads", "a positive int or None")
        if isinstance(self.tune_window_s, bool) or not isinstance(self.tune_window_s, (int, float)) \
                or not self.tune_window_s >= 0:
            bad("tune_window_s", "a number of seconds >= 0")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            bad("device", "'auto', 'cpu' or 'cuda'")

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineArgs:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; known: {sorted(names)}")
        return cls(**kwargs)


def default_page_size(hf_cfg, device) -> int:
    """KV page size when the user gave none: 64-row pages on a GPU, 16 on the CPU.

    On a GPU, 64 is the page size the CUDA MLA decode reads (mla.decode.cuda takes 64 / 128 /
    256), and the CUDA paged extend runs a long prefix's later turn ~14 % faster over 64-row
    pages than over 16-row ones (H200, Llama-3-8B, 50.8k cached + 800 new: 1515 -> 1302 us a
    layer; benchmarks/RESULTS.md, "Session 15"): fewer TMA boxes and page-table reads per key
    tile. A prefix is then cached in 64-token steps (a later turn recomputes at most 63 tokens
    of its history). The CPU keeps 16 (its kernels take any size; smaller pages waste less)."""
    del hf_cfg  # one size for every attention kind now; kept for the callers' signature
    return 64 if torch.device(device).type == "cuda" else 16


def _llama(hidden, inter, layers, heads, kv_heads, vocab, **kw):
    base = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden,
                intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=vocab, rms_norm_eps=1e-5,
                hidden_act="silu", bos_token_id=1, eos_token_id=2)
    return {**base, **kw}


_TINY = dict(hidden=128, inter=256, layers=2, heads=4, kv_heads=2, vocab=512)
_TINY_DSV3 = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=128,
    intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, vocab_size=512, q_lora_rank=96,
    kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
    max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=False,
    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=1024,
                      beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0))
_KIMI_K2 = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
    intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_attention_heads=64, num_key_value_heads=64, vocab_size=163840, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
    routed_scaling_factor=2.827, norm_topk_prob=True, first_k_dense_replace=1,
    max_position_embeddings=131072, rope_theta=50000.0, rms_norm_eps=1e-6, bos_token_id=163584,
    eos_token_id=163585, tie_word_embeddings=False, torch_dtype="bfloat16",
    rope_scaling=dict(type="yarn", factor=32.0, original_max_position_embeddings=4096,
                      beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))

DUMMY_CONFIGS: dict[str, dict] = {
    "llama-3-8b": _llama(4096, 14336, 32, 32, 8, 128256, rope_theta=500000.0,
                         max_position_embeddings=8192, bos_token_id=128000,
                         eos_token_id=[128001, 128009], torch_dtype="bfloat16"),
    "smollm2-135m": _llama(576, 1536, 30, 9, 3, 49152, rope_theta=100000.0,
                           max_position_embeddings=8192, tie_word_embeddings=True),
    "tiny-llama": _llama(**_TINY, max_position_embeddings=4096, tie_word_embeddings=False),
    "tiny-qwen3": dict(_llama(**_TINY, max_position_embeddings=4096), model_type="qwen3",
                       architectures=["Qwen3ForCausalLM"], head_dim=32, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
    "tiny-qwen3-moe": dict(_llama(**_TINY, max_position_embeddings=4096), model_type="qwen3_moe",
                           architectures=["Qwen3MoeForCausalLM"], head_dim=32, rms_norm_eps=1e-6,
                           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                           decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[],
                           tie_word_embeddings=False),
    "tiny-deepseek-v3": _TINY_DSV3,
    "kimi-k2": _KIMI_K2,
    "tiny-kimi-k2": dict(_KIMI_K2, hidden_size=256, intermediate_size=512,
                         moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=8,
                         num_key_value_heads=8, vocab_size=1024, q_lora_rank=128,
                         n_routed_experts=16, num_experts_per_tok=4, bos_token_id=1,
                         eos_token_id=2),
}


def load_model_config(model: str):
    """(transformers config, local checkpoint dir or None for dummy weights)."""
    from transformers import AutoConfig

    if model == "default":
        from .default_model import smollm2_dir
        model = smollm2_dir()
    if model.startswith("dummy:"):
        spec = model[len("dummy:"):]
        if spec in DUMMY_CONFIGS:
            d = dict(DUMMY_CONFIGS[spec])
        elif spec.endswith(".json") and os.path.isfile(spec):
            with open(spec) as f:
                d = json.load(f)
        else:
            raise ValueError(f"model: unknown dummy config {spec!r}; named configs: "
                             f"{sorted(DUMMY_CONFIGS)}, or dummy:/path/to/config.json")
        model_type = d.pop("model_type", None)
        if model_type is None:
            raise ValueError(f"model: config {spec!r} has no model_type")
        return _checked(AutoConfig.for_model(model_type, **d)), None
    if not os.path.isdir(model):
        raise ValueError(f"model: {model!r} is not 'default', a local HF directory, "
                         "'dummy:<name>' or 'dummy:/path/config.json'")
    return _checked(AutoConfig.from_pretrained(model)), model


def _checked(cfg):
    """The config, once serve.model_support found nothing in it the model code would compute
    differently from the checkpoint's own math (UnsupportedConfigError names every field)."""
    from .model_support import check_model_config
    check_model_config(cfg)
    return cfg


def rope_params(cfg) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from a transformers 4.x or 5.x config."""
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    scaling = getattr(cfg, "rope_scaling", None)
    if scaling:
        rp = {**dict(scaling), **rp}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind in (None, "default"):
        return float(theta), None
    return float(theta), {**rp, "rope_type": kind, "type": kind}


def mla_softmax_scale(cfg) -> float:
    """1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN (DeepSeek-V3)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    _, s = rope_params(cfg)
    if s and s.get("mscale_all_dim"):
        m = tskernels.rope.yarn_mscale(float(s["factor"]), float(s["mscale_all_dim"]))
        scale *= m * m
    return scale


def eos_token_ids(cfg, tokenizer=None, checkpoint: str | None = None) -> list[int]:
    """EOS ids from the config, generation_config.json (instruct models list several) and the
    checkpoint's own tokenizer."""
    def as_list(v):
        return [] if v is None else ([v] if isinstance(v, int) else list(v))

    ids = as_list(getattr(cfg, "eos_token_id", None))
    gen = os.path.join(checkpoint, "generation_config.json") if checkpoint else None
    if gen and os.path.isfile(gen):
        with open(gen) as f:
            ids += as_list(json.load(f).get("eos_token_id"))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted({int(i) for i in ids})
