"""A batched CPU backend for paged attention decode / extend, registered in the tskernels
registry (backend "torch_cpu", CPU only) so that the engine's CPU path keeps calling the public
ops and plans, naming this backend (`backend="torch_cpu"`).

Why: the reference walks requests one by one with ~25 small tensor ops each, per layer. Here
the plan (built once per step) precomputes the page gather indices and the masks, and `run`
(per layer) is one `index_select` per cache plus one fused SDPA call for all decode rows.
Same math as `tskernels_ref.attention` (tests/serve/test_models_cpu_attention.py checks it);
softcap / sliding window / sinks / fp8 caches are left to the reference (filtered by traits).

Contract difference, hence not run-verified (never auto-selected): whole pages are gathered, so
the unused slots of a request's last page, and the page-table padding (page ids, not garbage),
must hold finite values. The engine's pool guarantees both (zero-initialised, written only with
model outputs, rows padded with the null page 0). It could move to tskernels/ops/attention/ as a
CPU backend once it masks non-finite garbage too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tskernels.registry import Capability, register

BACKEND = "torch_cpu"
_CPU = Capability(vendors=frozenset({"cpu"}))
_KW = dict(backend=BACKEND, capability=_CPU, band="portable",
           formats={"q": ("fp32", "bf16", "fp16"), "kv": ("fp32", "bf16", "fp16")},
           traits={"softcap": (False,), "sliding_window": (False,), "sinks": (False,)},
           description="batched CPU attention: page gather + SDPA (serve)")


def _pages(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """Flat page ids [B * P] (P = pages of the longest row) and the key-valid mask [B, P*ps]."""
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    num = max(1, -(-max_len // page_size))
    table = page_table[:, :num].long()
    if table.shape[1] < num:  # a table narrower than the longest row cannot happen; be safe
        raise ValueError("page_table: fewer columns than the longest sequence needs")
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
        self.num_splits = 1

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        b, hq = q.shape[:2]
        dtype = torch.float32 if q.dtype != torch.float64 else q.dtype
        k = _gather(k_cache, self.idx, b, dtype)
        v = _gather(v_cache, self.idx, b, dtype)
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


def mm(a, b, *, out_dtype=None):
    """c = a @ b.T in the operands' dtype (bf16 GEMMs run natively through oneDNN with fp32
    accumulation; the reference upcasts both operands to fp32 on every call)."""
    c = torch.mm(a, b.t())
    return c if out_dtype is None or out_dtype == c.dtype else c.to(out_dtype)


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
_registered = False


def register_cpu_attention() -> None:
    """Add the backend to the registry (idempotent). Called by the engine on a CPU device."""
    global _registered
    if _registered:
        return
    register("attention", "store_kv", backend=BACKEND, capability=_CPU, band="portable",
             formats={"k": ("fp32", "bf16", "fp16"), "kv": ("fp32", "bf16", "fp16")},
             description="index_copy_ into the flattened cache (serve)")(store_kv)
    register("gemm", "mm", backend=BACKEND, capability=_CPU, band="portable",
             formats={"a": ("fp32", "bf16", "fp16"), "b": ("fp32", "bf16", "fp16"),
                      "c": ("fp32", "bf16", "fp16")},
             description="torch.mm in the operands' dtype (serve)")(mm)
    register("attention", "decode", **_KW)(decode)
    register("attention", "extend", **_KW)(extend)
    _registered = True
