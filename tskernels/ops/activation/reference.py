"""Reference backend of the activation family."""
from __future__ import annotations

import tskernels_ref.activation as ref

from ...registry import register
from .._common import REF, into


@register("activation", "silu_and_mul", **REF)
def silu_and_mul(x, out=None):
    return into(out, ref.silu_and_mul(x))


@register("activation", "gelu_tanh_and_mul", **REF)
def gelu_tanh_and_mul(x, out=None):
    return into(out, ref.gelu_tanh_and_mul(x))
