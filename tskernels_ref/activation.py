"""Activation references."""
from __future__ import annotations

import torch

from ._common import compute_dtype


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """y = silu(x[..., :I]) * x[..., I:], silu(g) = g * sigmoid(g); float32 math, x.dtype result.

    Args:
        x: [..., 2I] (gate half first, then up half).
    Returns:
        y [..., I] in x.dtype.
    """
    dtype = compute_dtype(x)
    half = x.shape[-1] // 2
    gate, up = x[..., :half].to(dtype), x[..., half:].to(dtype)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """y = gelu_tanh(x[..., :I]) * x[..., I:] (Gemma-style gated MLP); x [..., 2I] -> [..., I]."""
    dtype = compute_dtype(x)
    half = x.shape[-1] // 2
    gate, up = x[..., :half].to(dtype), x[..., half:].to(dtype)
    return (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(x.dtype)
