"""Reference backend of the gdn family: tskernels_ref in plain PyTorch."""
from __future__ import annotations

import tskernels_ref.gdn as ref

from ...registry import register
from .._common import REF


@register("gdn", "chunk_prefill", **REF)
def chunk_prefill(q, k, v, g, beta, *, cu_seqlens, initial_state, **kw):
    # The reference builds its work tensors on the CPU: run it there, return to q's device.
    dev = q.device
    cpu = [t.cpu() for t in (q, k, v, g, beta)]
    o, final = ref.chunk_prefill(*cpu, cu_seqlens=cu_seqlens.cpu(),
                                 initial_state=None if initial_state is None
                                 else initial_state.cpu(), **kw)
    return o.to(dev), final.to(dev)


@register("gdn", "decode_step", **REF)
def decode_step(q, k, v, g, beta, state, state_slots, **kw):
    return ref.decode_step(q, k, v, g, beta, state, state_slots, **kw)


@register("gdn", "gate", **REF)
def gate(a, b, A_log, dt_bias):
    return ref.gate(a, b, A_log, dt_bias)


@register("gdn", "causal_conv1d", **REF)
def causal_conv1d(x, weight, bias=None, **kw):
    return ref.causal_conv1d(x, weight, bias, **kw)


@register("gdn", "causal_conv1d_update", **REF)
def causal_conv1d_update(x, conv_state, weight, bias=None, **kw):
    return ref.causal_conv1d_update(x, conv_state, weight, bias, **kw)
