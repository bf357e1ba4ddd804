"""Gated activations: silu_and_mul(x) = silu(x[..., :I]) * x[..., I:]; gelu_tanh_and_mul(x) =
gelu_tanh(x[..., :I]) * x[..., I:] (GeGLU with the tanh approximation: Gemma, GELU-tanh Llamas)."""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from .._common import load_backends

BACKENDS = load_backends(__name__, __path__)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None,
                 backend: str | None = None) -> torch.Tensor:
    """SwiGLU gate: x [..., 2I] (gate half first, then up) fp32/fp16/bf16, last dim contiguous.
    out: optional [..., I] buffer of x's dtype. Returns [..., I]; math in fp32.

    >>> import torch, tskernels
    >>> tskernels.activation.silu_and_mul(torch.tensor([[0.0, 1.0, 5.0, 7.0]])).tolist()
    [[0.0, 5.1096...]]
    """
    return _gated("silu_and_mul", x, out, backend)


def gelu_tanh_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None,
                      backend: str | None = None) -> torch.Tensor:
    """GeGLU gate, tanh approximation (HF "gelu_pytorch_tanh" / "gelu_new"):
    gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). x [..., 2I] (gate half
    first, then up) fp32/fp16/bf16, last dim contiguous; out: optional [..., I] buffer of x's
    dtype. Returns [..., I]; math in fp32.

    >>> import torch, tskernels
    >>> tskernels.activation.gelu_tanh_and_mul(torch.tensor([[0.0, 1.0, 5.0, 7.0]])).tolist()
    [[0.0, 5.8883...]]
    """
    return _gated("gelu_tanh_and_mul", x, out, backend)


def _gated(op: str, x: torch.Tensor, out: torch.Tensor | None, backend: str | None):
    _check.tensor("x", x, ndim=(1, 2, 3), dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    if x.shape[-1] % 2:
        raise ValueError(f"x: the last dimension must be even (gate and up halves), "
                         f"got {x.shape[-1]}")
    half = x.shape[-1] // 2
    _check.optional("out", out, shape=(*x.shape[:-1], half), dtypes=(x.dtype,), device=x.device)
    k = select("activation", op, device=x.device, formats={"x": fmt(x.dtype)}, backend=backend)
    return k(x, out=out)
