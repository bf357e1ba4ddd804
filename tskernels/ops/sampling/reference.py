"""Reference backend of the sampling family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.sampling as ref

from ...registry import register
from .._common import REF


@register("sampling", "sample", **REF)
def sample(logits, **params):
    return ref.sample(logits, **params)


@register("sampling", "greedy", **REF)
def greedy(logits):
    return ref.greedy(logits)


@register("sampling", "apply_penalties", **REF)
def apply_penalties(logits, **params):
    """Reference penalties, written back into logits (the public op is in place)."""
    logits.copy_(ref.apply_penalties(logits, **params))
    return logits
