"""CPU backend of paged attention ("torch_cpu"): batched page gather + one SDPA call.

The reference walks requests one at a time with ~25 small tensor ops each; here the plan (built
once per batch, shared by every layer) precomputes the page gather indices and the key masks,
and `run` does one `index_select` per cache plus one fused SDPA for all decode rows (extend:
one SDPA per request). Same math as `tskernels_ref.attention`. Robust to the contract's
garbage: page-table entries past a row's pages are never dereferenced (clamped to page 0) and
gathered keys/values outside a row's length are zeroed before use, so NaN-poisoned slots
cannot leak. Softcap / sliding window / sinks / fp8 caches fall to the reference (traits and
formats below). CPU only; run-verified on the CPU by tests/kernels/test_attention_torch_cpu.py.
Opt-in (never auto-selected: on a CPU the reference is the default): engines name it, as
serve's model runner does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...registry import Capability, register

BACKEND = "torch_cpu"
CPU_ONLY = Capability(vendors=frozenset({"cpu"}))
_FORMATS = ("fp32", "bf16", "fp16", "fp64")
_KW = dict(backend=BACKEND, capability=CPU_ONLY, band="portable", run_verified=("cpu",), opt_in=True,
           tags=("deterministic",), formats={"q": _FORMATS, "kv": _FORMATS},
           traits={"softcap": (False,), "sliding_window": (False,), "sinks": (False,)})


def _pages(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """Flat page ids [B * P] (P = pages of the longest row) and the key-valid mask [B, P*ps]."""
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    num = max(1, -(-max_len // page_size))
    table = page_table[:, :num].long()
    if table.shape[1] < num:
        raise ValueError(f"page_table: {table.shape[1]} columns, the longest sequence "
                         f"({max_len} tokens) needs {num} pages")
    # Entries past a row's own pages are arbitrary: never dereference them.
    own = torch.arange(num)[None, :] < (-(-seq_lens.long() // page_size))[:, None]
    table = torch.where(own, table, torch.zeros_like(table))
    keys = torch.arange(num * page_size)
    return table.reshape(-1), keys[None, :] < seq_lens.long()[:, None], num


def _gather(cache: torch.Tensor, idx: torch.Tensor, rows: int, dtype) -> torch.Tensor:
    """[rows, Hkv, L, D] keys/values of the gathered pages (L = pages * page_size)."""
    g = cache.index_select(0, idx)
    hkv, d = cache.shape[2:]
    return g.view(rows, -1, hkv, d).transpose(1, 2).to(dtype)


class DecodePlan:
    def __init__(self, page_table, seq_lens, *, scale, page_size, **_):
        self.scale = scale
        self.idx, valid, _ = _pages(page_table, seq_lens, page_size)
        self.rows = page_table.shape[0]
        self.empty = (seq_lens == 0)
        if bool(self.empty.any()):  # SDPA needs one visible key; the row is zeroed afterwards
            valid[self.empty, 0] = True
        else:
            self.empty = None
        self.mask = valid[:, None, None, :]  # [B, 1, 1, L]
        self.kv_keep = valid[:, None, :, None]  # zero gathered garbage (NaN-poisoned slots)
        self.num_splits = 1

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        b, hq = q.shape[:2]
        dtype = torch.float32 if q.dtype != torch.float64 else q.dtype
        k = _gather(k_cache, self.idx, b, dtype).where(self.kv_keep, 0.0)
        v = _gather(v_cache, self.idx, b, dtype).where(self.kv_keep, 0.0)
        o = F.scaled_dot_product_attention(q.to(dtype)[:, :, None, :], k, v,
                                           attn_mask=self.mask, scale=self.scale,
                                           enable_gqa=hq != k.shape[1])[:, :, 0]
        if self.empty is not None:
            o[self.empty] = 0
        o = o.to(q.dtype)
        return o if out is None else out.copy_(o)


class ExtendPlan:
    """Per request: its gathered pages and a causal mask [n, L]; prefill chunks are few per step,
    so a short loop over requests costs little next to the GEMMs."""

    def __init__(self, qo_indptr, page_table, seq_lens, *, scale, page_size, causal=True, **_):
        self.scale = scale
        bounds = qo_indptr.tolist()
        self.parts = []
        for b, length in enumerate(seq_lens.tolist()):
            s, e = bounds[b], bounds[b + 1]
            n = e - s
            if n == 0:
                continue
            if length == 0:
                self.parts.append((s, e, None, None, 0))
                continue
            pages = page_table[b, :-(-length // page_size)].long()
            q_pos = torch.arange(length - n, length)
            mask = (torch.arange(length)[None, :] <= q_pos[:, None]) if causal else None
            self.parts.append((s, e, pages, mask, length))

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        dtype = torch.float32 if q.dtype != torch.float64 else q.dtype
        o = torch.zeros(q.shape, dtype=q.dtype) if out is None else out
        hkv, d = k_cache.shape[2:]
        for s, e, pages, mask, length in self.parts:
            if pages is None:
                o[s:e] = 0
                continue
            k = k_cache.index_select(0, pages).view(-1, hkv, d)[:length].transpose(0, 1)
            v = v_cache.index_select(0, pages).view(-1, hkv, d)[:length].transpose(0, 1)
            qb = q[s:e].transpose(0, 1).to(dtype)
            ob = F.scaled_dot_product_attention(qb, k.to(dtype), v.to(dtype), attn_mask=mask,
                                                scale=self.scale,
                                                enable_gqa=qb.shape[0] != hkv)
            o[s:e] = ob.transpose(0, 1).to(q.dtype)
        return o


def store_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """k_cache.view(slots)[slot_mapping] = k (and v): one index_copy_ per cache."""
    slots = slot_mapping
    if slots.numel() and int(slots.min()) < 0:  # padding rows (CPU: the check is cheap)
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    _, _, hkv, d = k_cache.shape
    k_cache.view(-1, hkv, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, hkv, d).index_copy_(0, slots, v.to(v_cache.dtype))


def decode(q, k_cache, v_cache, page_table, seq_lens, *, scale=None, **_):
    scale = scale or q.shape[-1] ** -0.5
    return DecodePlan(page_table, seq_lens, scale=scale, page_size=k_cache.shape[1]).run(
        q, k_cache, v_cache)


def extend(q, k_cache, v_cache, qo_indptr, page_table, seq_lens, *, causal=True, scale=None,
           **_):
    scale = scale or q.shape[-1] ** -0.5
    return ExtendPlan(qo_indptr, page_table, seq_lens, scale=scale, causal=causal,
                      page_size=k_cache.shape[1]).run(q, k_cache, v_cache)


decode.make_plan = DecodePlan
extend.make_plan = ExtendPlan

register("attention", "store_kv", backend=BACKEND, capability=CPU_ONLY, band="portable",
         run_verified=("cpu",), opt_in=True, tags=("deterministic",),
         formats={"k": _FORMATS, "kv": _FORMATS})(store_kv)
register("attention", "decode", **_KW)(decode)
register("attention", "extend", **_KW)(extend)
