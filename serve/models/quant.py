"""Weight-only int8 / 4-bit serving on the CPU (`--quantization int8` / `int4`).

After the checkpoint is loaded, every dense Linear (and the logits projection, tied or not)
gets int8 weights with one float32 scale per output row (tskernels.gemm.quantize_int8_per_channel)
and its float weight is freed; forward then runs tskernels' gemm.int8w_mm, which streams the
packed int8 weights (the CPU C++ kernel "cpu_stream" under the engine's policy). The embedding
lookup keeps its float table. Accuracy is bounded by tests/serve/test_quantized_cpu.py
(perplexity and logit error vs fp32 on a fixed text; docs/CPU.md has the figures).
"""
from __future__ import annotations

import torch

import tskernels
from tskernels import fmt

from . import bound_ops

MODES = ("auto", "none", "int8", "int4")


def resolve(mode: str, *, device: torch.device, dtype_arg: str) -> str:
    """The quantization a engine runs: "auto" is int8 on the CPU when the dtype is left to the
    engine (the fastest CPU mode within the documented tolerance), else "none"."""
    if mode not in MODES:
        raise ValueError(f"quantization: expected one of {MODES}, got {mode!r}")
    if mode == "auto":
        return "int8" if device.type == "cpu" and dtype_arg == "auto" else "none"
    if mode in ("int8", "int4") and device.type != "cpu":
        raise ValueError(f"quantization: {mode!r} (weight-only) runs on the CPU only; "
                         f"the engine's device is {device}")
    return mode


def int8w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, act_int8: bool = False,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """c = a @ (q * scale).T with the registry's choice bound once (see bound_ops); act_int8
    (int4 mode's logits projection: the third item of its int8 tuple) multiplies int8
    activation groups in integers."""
    c = out_dtype or a.dtype
    k = bound_ops.bind(("int8w_mm", a.dtype, c), "gemm", "int8w_mm",
                       lambda: dict(formats={"a": fmt(a.dtype), "b": "int8", "c": fmt(c)}))
    lean = _lean(k, a, c)
    if lean is not None:
        return lean(a, q, scale, act_int8)
    return k(a, q, scale, act_int8=act_int8, out_dtype=out_dtype)


def _lean(k, a: torch.Tensor, c: torch.dtype):
    """The bound kernel's lean decode-row entry when it has one and this call fits it (the C++
    decode-row GEMM's: float32 M <= 16 contiguous, skipping the general wrapper's stride
    handling; the weights come contiguous from this module's quantizers), else None."""
    lean = getattr(k.fn, "decode_rows", None)
    return lean if lean is not None and k.fn.fits(a, c) else None


# int4 mode quantizes the activations too (per group of 32 to int8, integer dot products: GGUF's
# Q4_1 x Q8_1), at every batch size and in prefill, so that a request's tokens do not depend on
# what it is batched with. It halves the CPU work per weight of widening the 4-bit groups to
# float and is the fastest batch-1 decode measured; at batch 8 int8 weights are faster
# (benchmarks/RESULTS.md, issue 22), which is why "auto" stays int8.
INT4_ACT_INT8 = True


def q4w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, mins: torch.Tensor,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """c = a @ W.T, W 4-bit in groups of 32 (tskernels.gemm.q4w_mm, act_int8), bound once."""
    c = out_dtype or a.dtype
    k = bound_ops.bind(("q4w_mm", a.dtype, c), "gemm", "q4w_mm",
                       lambda: dict(formats={"a": fmt(a.dtype), "b": "uint4", "c": fmt(c)}))
    lean = _lean(k, a, c)
    if lean is not None:
        return lean(a, q, scale, mins, INT4_ACT_INT8)
    return k(a, q, scale, mins, act_int8=INT4_ACT_INT8, out_dtype=out_dtype)


def quantize_int4(model) -> int:
    """`--quantization int4`: as quantize_int8, but the dense Linears whose input width is a
    multiple of 32 get 4-bit weights (tskernels.gemm.quantize_q4_groups: asymmetric, groups
    of 32 along K, GGUF Q4_1's block with float32 scales); the others and the logits
    projection stay int8 per row (the shipped GGUF keeps its tied embedding at 8 bits too);
    the logits projection multiplies int8 activation groups as well (gemm.int8w_mm act_int8).
    Returns the weight bytes saved."""
    from .layers import Linear

    saved = 0
    head = getattr(model, "lm_head", None)  # compute_logits reads an int8 head
    for mod in model.modules():
        if isinstance(mod, Linear) and mod is not head and mod.weight_scale_inv is None \
                and mod.weight.dim() == 2 and not getattr(mod, "keep_dense", False) \
                and mod.weight.shape[1] % 32 == 0:
            w = mod.weight
            mod.q4 = tskernels.gemm.quantize_q4_groups(w)
            saved += w.numel() * w.element_size() - w.numel() // 2 - w.numel() // 4
            mod.weight = torch.nn.Parameter(w.new_empty(0, w.shape[1]), requires_grad=False)
    saved += quantize_int8(model)
    # the logits projection (int8 weights) takes int8 activation groups too, like every 4-bit
    # Linear: integer dot products (Q8_0 x Q8_0) instead of widening 28 M weights to float
    # per token; its call sites unpack the tuple, whose third item is act_int8
    tied = getattr(model, "int8_lm_head", None)
    if tied is not None and tied[0].shape[1] % 32 == 0:
        model.int8_lm_head = (*model.int8_lm_head, INT4_ACT_INT8)
    if head is not None and head.int8 is not None and head.int8[0].shape[1] % 32 == 0:
        head.int8 = (*head.int8, INT4_ACT_INT8)
    return saved


def quantize_int8(model) -> int:
    """Quantize the model's dense Linears and its logits projection in place; returns the
    number of weight bytes saved (float weights freed minus int8 + scales kept)."""
    from .layers import Linear

    saved = 0
    for mod in model.modules():
        # keep_dense: Linears whose float weight is read directly (a router's fp32 logits,
        # MLA's kv_b_proj absorbed at load)
        if isinstance(mod, Linear) and mod.weight_scale_inv is None and mod.weight.dim() == 2 \
                and not getattr(mod, "keep_dense", False) and mod.weight.numel() > 0:
            w = mod.weight
            mod.int8 = tskernels.gemm.quantize_int8_per_channel(w)
            saved += w.numel() * w.element_size() - w.numel() - 4 * w.shape[0]
            mod.weight = torch.nn.Parameter(w.new_empty(0, w.shape[1]), requires_grad=False)
    if getattr(model, "tie", False) and hasattr(model, "embed_tokens"):
        # tied logits: the embedding keeps its float table for the lookup, the projection
        # reads an int8 copy (the largest matrix of a small model: 49152 x 576 in SmolLM2)
        w = model.embed_tokens.weight
        model.int8_lm_head = tskernels.gemm.quantize_int8_per_channel(w)
        saved -= w.numel() + 4 * w.shape[0]
    return saved
