"""Reference backend of the attention family."""
from __future__ import annotations

import tskernels_ref.attention as ref

from ...plan import PlanBase
from ...registry import register
from .._common import REF


class RefDecodePlan(PlanBase):
    """Plan over the reference decode: stores the metadata, runs eagerly (not graph-safe)."""

    KERNEL = "attention.decode.reference"
    REPR_FIELDS = ("opts",)

    def __init__(self, page_table, seq_lens, *, scale, sliding_window=None, softcap=None,
                 **_):
        self.page_table, self.seq_lens = page_table, seq_lens
        self.opts = dict(scale=scale, sliding_window=sliding_window, softcap=softcap)
        self.num_splits = 1

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        o = ref.decode(q, k_cache, v_cache, self.page_table, self.seq_lens, sinks=sinks,
                       k_scale=k_scale, v_scale=v_scale, **self.opts)
        return o if out is None else out.copy_(o)


class RefExtendPlan(PlanBase):
    """Plan over the reference extend: stores the metadata, runs eagerly (not graph-safe)."""

    KERNEL = "attention.extend.reference"
    REPR_FIELDS = ("opts",)

    def __init__(self, qo_indptr, page_table, seq_lens, *, scale, causal=True,
                 sliding_window=None, softcap=None, **_):
        self.args = (qo_indptr, page_table, seq_lens)
        self.opts = dict(scale=scale, causal=causal, sliding_window=sliding_window,
                         softcap=softcap)

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None,
            k=None, v=None):  # k, v: the new tokens' K/V, equal to the cache's (read from it)
        o = ref.extend(q, k_cache, v_cache, *self.args, sinks=sinks, k_scale=k_scale,
                       v_scale=v_scale, **self.opts)
        return o if out is None else out.copy_(o)


@register("attention", "store_kv", **REF)
def store_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    ref.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)


@register("attention", "rope_store_kv", **REF)
def rope_store_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, *, style,
                  q_norm_weight=None, k_norm_weight=None, eps=1e-6):
    return ref.rope_store_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                             style=style, q_norm_weight=q_norm_weight,
                             k_norm_weight=k_norm_weight, eps=eps)


@register("attention", "decode", **REF, plan=RefDecodePlan)
def decode(q, k_cache, v_cache, page_table, seq_lens, **kw):
    return ref.decode(q, k_cache, v_cache, page_table, seq_lens, **kw)


@register("attention", "extend", **REF, plan=RefExtendPlan)
def extend(q, k_cache, v_cache, qo_indptr, page_table, seq_lens, *, k=None, v=None, **kw):
    # k, v (the new tokens' K/V) equal what the cache holds: the reference reads the cache
    return ref.extend(q, k_cache, v_cache, qo_indptr, page_table, seq_lens, **kw)


@register("attention", "merge_states", **REF)
def merge_states(o_a, lse_a, o_b, lse_b):
    return ref.merge_states(o_a, lse_a, o_b, lse_b)
