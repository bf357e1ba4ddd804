"""RMSNorm references (float32 math, result cast to x.dtype, flashinfer/vLLM style)."""
from __future__ import annotations

import torch

from ._common import compute_dtype


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, computed in float32, returned in x.dtype.

    Args:
        x: [..., N].
        weight: [N].
    Returns:
        y [..., N] in x.dtype.
    """
    dtype = compute_dtype(x, weight)
    xf = x.to(dtype)
    rrms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rrms * weight.to(dtype)).to(x.dtype)


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = (x + residual) rounded to x.dtype;  y = rmsnorm(new_residual, weight, eps).

    The norm reads the *rounded* residual, as the next layer will.

    Args:
        x: [..., N].
        residual: [..., N], same dtype as x.
        weight: [N].
    Returns:
        (y [..., N], new_residual [..., N]), both in x.dtype.
    """
    dtype = compute_dtype(x, residual)
    new_residual = (x.to(dtype) + residual.to(dtype)).to(x.dtype)
    return rmsnorm(new_residual, weight, eps), new_residual
