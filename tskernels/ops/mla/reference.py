"""Reference backend of the MLA family."""
from __future__ import annotations

import torch

import tskernels_ref.mla as ref

from ...plan import PlanBase
from ...registry import register
from .._common import REF


class RefDecodePlan(PlanBase):
    """Plan over the reference MLA decode: stores the metadata, runs eagerly."""

    KERNEL = "mla.decode.reference"
    REPR_FIELDS = ("opts",)

    def __init__(self, page_table, seq_lens, *, scale, kv_lora_rank, **_):
        self.args = (page_table, seq_lens)
        self.opts = dict(scale=scale, kv_lora_rank=kv_lora_rank)
        self.num_splits = 1

    def run(self, q, kv_cache, *, kv_scale=None, out=None):
        o = ref.decode(q, kv_cache, *self.args, kv_scale=kv_scale, **self.opts)
        return o if out is None else out.copy_(o)


class RefExtendPlan(PlanBase):
    """Plan over the reference MLA extend: stores the metadata, runs eagerly (not graph-safe).
    Given host copies of the lengths (mla.extend_plan) it runs on those, reading nothing back
    from the device tensors."""

    KERNEL = "mla.extend.reference"
    REPR_FIELDS = ("opts",)

    def __init__(self, qo_indptr, page_table, seq_lens, *, scale, causal=True, kv_lora_rank,
                 host_qo_indptr=None, host_seq_lens=None, **_):
        if host_qo_indptr is not None and host_seq_lens is not None:
            qo_indptr, seq_lens = torch.as_tensor(host_qo_indptr), torch.as_tensor(host_seq_lens)
        self.args = (qo_indptr, page_table, seq_lens)
        self.opts = dict(scale=scale, causal=causal, kv_lora_rank=kv_lora_rank)

    def run(self, q, kv_cache, *, kv_scale=None, out=None):
        o = ref.extend(q, kv_cache, *self.args, kv_scale=kv_scale, **self.opts)
        return o if out is None else out.copy_(o)


@register("mla", "decode", **REF, plan=RefDecodePlan)
def decode(q, kv_cache, page_table, seq_lens, **kw):
    return ref.decode(q, kv_cache, page_table, seq_lens, **kw)


@register("mla", "extend", **REF, plan=RefExtendPlan)
def extend(q, kv_cache, qo_indptr, page_table, seq_lens, **kw):
    return ref.extend(q, kv_cache, qo_indptr, page_table, seq_lens, **kw)
