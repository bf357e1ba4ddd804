"""YaRN rotary tables (DeepSeek-V3 / Kimi-K2 / Qwen long-context configs).

Frequencies are blended between extrapolation (short wavelengths, kept) and interpolation by
1/factor (long wavelengths) with a linear ramp over the correction range of dimensions
[low, high], and cos / sin are multiplied by the attention factor mscale(factor) (or the ratio
mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given), as HF
transformers' "yarn" rope does. float32 math, as the checkpoints were trained with.
"""
from __future__ import annotations

import math

import torch


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_cos_sin_cache(max_position: int, dim: int, base: float, s: dict) -> torch.Tensor:
    """float32 [max_position, dim] table (cos half, sin half) for scaling dict `s`
    ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
    "mscale_all_dim", "attention_factor", "truncate")."""
    factor = float(s["factor"])
    orig = float(s.get("original_max_position_embeddings", 4096))
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)
    mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        attn_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
                       if mscale and mscale_all else yarn_mscale(factor))

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    if s.get("truncate", True) is False:
        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrap = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos() * attn_factor, freqs.sin() * attn_factor], dim=-1)
