"""Reference backend of the norm family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.norm as ref

from ...registry import register
from .._common import REF, into


@register("norm", "rmsnorm", **REF)
def rmsnorm(x, weight, eps, out=None):
    return into(out, ref.rmsnorm(x, weight, eps))


@register("norm", "fused_add_rmsnorm", **REF)
def fused_add_rmsnorm(x, residual, weight, eps):
    return ref.fused_add_rmsnorm(x, residual, weight, eps)
