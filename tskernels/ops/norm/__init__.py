"""RMSNorm, alone and fused with the residual add.

    y = x / sqrt(mean(x**2, -1) + eps) * weight
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from .._common import load_backends

BACKENDS = load_backends(__name__, __path__)


def _problem(x: torch.Tensor, weight: torch.Tensor, name: str = "x") -> dict:
    _check.tensor(name, x, ndim=(2, 3, 4), dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    _check.tensor("weight", weight, ndim=1, dtypes=_check.FLOAT_OR_FP64,
                  shape=(x.shape[-1],), device=x.device)
    return dict(device=x.device, formats={"x": fmt(x.dtype), "weight": fmt(weight.dtype)},
                traits={"hidden": x.shape[-1]})


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
            out: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """RMSNorm over the last dimension.

    x: [..., N] fp32/fp16/bf16 (last dim contiguous). weight: [N]. out: optional [..., N]
    buffer of x's dtype (for CUDA graphs). Returns y, same shape and dtype as x; the sum of
    squares is accumulated in fp32.

    >>> import torch, tskernels
    >>> y = tskernels.norm.rmsnorm(torch.ones(2, 8), torch.full((8,), 2.0))
    >>> y[0, :3].tolist()
    [2.0, 2.0, 2.0]
    """
    prob = _problem(x, weight)
    _check.positive("eps", eps)
    _check.optional("out", out, shape=tuple(x.shape), dtypes=(x.dtype,), device=x.device)
    return select("norm", "rmsnorm", backend=backend, **prob)(x, weight, eps, out=out)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, *, backend: str | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm, in one pass: r = x + residual; y = rmsnorm(r).

    x, residual: [..., N], same dtype. weight: [N]. Returns (y, r), both like x. The sum is
    rounded to x's dtype before normalising (as the unfused PyTorch code does).
    """
    prob = _problem(x, weight)
    _check.tensor("residual", residual, shape=tuple(x.shape), dtypes=(x.dtype,),
                  device=x.device, contiguous_last=True)
    _check.positive("eps", eps)
    return select("norm", "fused_add_rmsnorm", backend=backend, **prob)(x, residual, weight, eps)
