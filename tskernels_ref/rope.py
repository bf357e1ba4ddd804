"""Rotary position embedding references (neox and gptj styles, partial rotary, scaling)."""
from __future__ import annotations

import math

import torch

from ._common import compute_dtype


def _inv_freq(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    if not scaling or scaling.get("type", scaling.get("rope_type")) in (None, "default", "linear"):
        return inv_freq
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "llama3":
        raise ValueError(f"rope scaling type {kind!r} not supported by the reference")
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are stretched by `factor`, short ones kept,
    # and the band between them is interpolated smoothly.
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def cos_sin_cache(
    max_position: int,
    rotary_dim: int,
    base: float = 10000.0,
    *,
    scaling: dict | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """cache[p] = [cos(p * f_0..f_{r/2-1}), sin(p * f_0..f_{r/2-1})], f_i = base^(-2i/r).

    scaling: None; {"type": "linear", "factor": f} (positions divided by f); or
    {"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (Llama-3.1 frequency remap). Computed in float64.

    Returns:
        cache [max_position, rotary_dim] in `dtype` (first half cos, second half sin).
    """
    inv_freq = _inv_freq(rotary_dim, base, scaling)
    pos = torch.arange(max_position, dtype=torch.float64)
    if scaling and scaling.get("type", scaling.get("rope_type")) == "linear":
        pos = pos / float(scaling["factor"])
    freqs = torch.outer(pos, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str, rotary_dim: int) -> torch.Tensor:
    """x [T, H, D] (compute dtype), cos/sin [T, rotary_dim/2] -> rotated copy."""
    out = x.clone()
    cos, sin = cos[:, None, :], sin[:, None, :]
    if style == "neox":
        half = rotary_dim // 2
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rotary_dim] = x2 * cos + x1 * sin
    elif style == "gptj":
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = x1 * cos - x2 * sin
        out[..., 1:rotary_dim:2] = x2 * cos + x1 * sin
    else:
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    return out


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    style: str = "neox",
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate the first rotary_dim dims of every head of q and k by its token's position.

    Pairs (x_a, x_b) with angle theta_i = positions[t] * f_i become
    (x_a cos - x_b sin, x_b cos + x_a sin). neox: pair i = (i, i + r/2); gptj: (2i, 2i + 1).
    Dims past rotary_dim pass through.

    Args:
        q: [T, Hq, D].
        k: [T, Hk, D] or None.
        positions: int32/int64 [T].
        cos_sin_cache: [max_position, r] from `cos_sin_cache` (r = its width).
        rotary_dim: dims that rotate (default r); must be even and <= D.
    Returns:
        (q_out, k_out) with the shapes and dtypes of q and k (new tensors).
    """
    rotary_dim = rotary_dim or cos_sin_cache.shape[-1]
    dtype = compute_dtype(q, cos_sin_cache)
    cs = cos_sin_cache[positions.long()].to(dtype)
    half = cos_sin_cache.shape[-1] // 2
    cos, sin = cs[:, : rotary_dim // 2], cs[:, half : half + rotary_dim // 2]
    q_out = _rotate(q.to(dtype), cos, sin, style, rotary_dim).to(q.dtype)
    k_out = None if k is None else _rotate(k.to(dtype), cos, sin, style, rotary_dim).to(k.dtype)
    return q_out, k_out
