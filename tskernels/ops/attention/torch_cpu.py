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

from ...plan import PlanBase
from ...registry import Capability, register
from . import _validate as v_

try:
    from ... import _cpu  # fp32 fast paths (decode attention, K/V store)
except ImportError:
    _cpu = None

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


class DecodePlan(PlanBase):
    """Gather indices and key masks of a decode batch, built once; `run` per layer."""

    KERNEL = "attention.decode.torch_cpu"
    REPR_FIELDS = ("rows", "page_size", "scale")

    def __init__(self, page_table, seq_lens, *, scale, page_size, **_):
        self.scale, self.page_size = scale, page_size
        self.page_table, self.seq_lens = page_table, seq_lens
        self.rows = page_table.shape[0]
        self.num_splits = 1
        self._torch_plan = None

    def _native(self, q, k_cache, v_cache, out) -> bool:
        """fp32 / bf16 problems in plain layouts run tskernels._cpu's paged decode kernel."""
        return (_cpu is not None and k_cache.dtype == v_cache.dtype and
                k_cache.dtype in (torch.float32, torch.bfloat16)
                and q.dtype in (torch.float32, torch.bfloat16)
                and k_cache.is_contiguous() and v_cache.is_contiguous()
                and q.stride(-1) == 1 and (out is None or out.stride(-1) == 1)
                and self.page_table.dtype == self.seq_lens.dtype == torch.int32
                and self.page_table.stride(-1) == 1 and self.seq_lens.is_contiguous())

    def _prepare_torch(self):
        """Gather indices and masks of the torch path (built on first use)."""
        idx, valid, _ = _pages(self.page_table, self.seq_lens, self.page_size)
        empty = (self.seq_lens == 0)
        if bool(empty.any()):  # SDPA needs one visible key; the row is zeroed afterwards
            valid[empty, 0] = True
        else:
            empty = None
        # mask [B, 1, 1, L]; kv_keep zeroes gathered garbage (NaN-poisoned slots)
        self._torch_plan = (idx, empty, valid[:, None, None, :], valid[:, None, :, None])
        return self._torch_plan

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        b, hq = q.shape[:2]
        if self._native(q, k_cache, v_cache, out):
            # fp32 math: a bf16 cache is widened as it is read, bf16 q once, o rounded once
            direct = q.dtype == torch.float32
            qf = q if direct else q.float()
            o = out if direct and out is not None else torch.empty_like(qf)
            num_pages, page_size, hkv, d = k_cache.shape
            _cpu.decode_attn_f32(qf.data_ptr(), qf.stride(0), qf.stride(1), k_cache.data_ptr(),
                                 v_cache.data_ptr(), num_pages, page_size, hkv, d,
                                 self.page_table.data_ptr(), self.page_table.stride(0),
                                 self.page_table.shape[1], self.seq_lens.data_ptr(), b, hq,
                                 float(self.scale), o.data_ptr(), o.stride(0), o.stride(1),
                                 bf16_cache=k_cache.dtype == torch.bfloat16)
            if direct:
                return o
            o = o.to(q.dtype)
            return o if out is None else out.copy_(o)
        idx, empty, mask, kv_keep = self._torch_plan or self._prepare_torch()
        dtype = torch.float32 if q.dtype != torch.float64 else q.dtype
        k = _gather(k_cache, idx, b, dtype).where(kv_keep, 0.0)
        v = _gather(v_cache, idx, b, dtype).where(kv_keep, 0.0)
        o = F.scaled_dot_product_attention(q.to(dtype)[:, :, None, :], k, v,
                                           attn_mask=mask, scale=self.scale,
                                           enable_gqa=hq != k.shape[1])[:, :, 0]
        if empty is not None:
            o[empty] = 0
        o = o.to(q.dtype)
        return o if out is None else out.copy_(o)


class ExtendPlan(PlanBase):
    """Per request: its gathered pages and a causal mask [n, L]; prefill chunks are few per step,
    so a short loop over requests costs little next to the GEMMs."""

    KERNEL = "attention.extend.torch_cpu"
    REPR_FIELDS = ("scale",)

    def __init__(self, qo_indptr, page_table, seq_lens, *, scale, page_size, causal=True,
                 host_qo_indptr=None, host_seq_lens=None, **_):
        self.scale = scale
        bounds, lens = v_.host_lengths(qo_indptr, seq_lens, host_qo_indptr, host_seq_lens)
        bounds = bounds.tolist()
        self.parts = []
        for b, length in enumerate(lens.tolist()):
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

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None,
            k=None, v=None):  # k, v: the new tokens' K/V, equal to the cache's (read from it)
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
    """k_cache.view(slots)[slot_mapping] = k (and v): one index_copy_ per cache (fp32 / bf16
    caches: tskernels._cpu's row copy)."""
    slots = slot_mapping
    _, _, hkv, d = k_cache.shape
    if (_cpu is not None and k.dtype == v.dtype == k_cache.dtype == v_cache.dtype
            and k.dtype in (torch.float32, torch.bfloat16)
            and k_cache.is_contiguous() and v_cache.is_contiguous() and slots.is_contiguous()
            and slots.dtype == torch.int64):
        n = k_cache.shape[0] * k_cache.shape[1]
        for src, cache in ((k, k_cache), (v, v_cache)):
            src = src.reshape(src.shape[0], hkv * d)
            if src.stride(1) != 1:
                src = src.contiguous()
            _cpu.store_rows(src.data_ptr(), src.stride(0), cache.data_ptr(), n, hkv * d,
                            slots.data_ptr(), slots.shape[0], src.element_size())
        return
    if slots.numel() and int(slots.min()) < 0:  # padding rows (CPU: the check is cheap)
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    k_cache.view(-1, hkv, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, hkv, d).index_copy_(0, slots, v.to(v_cache.dtype))



register("attention", "store_kv", backend=BACKEND, capability=CPU_ONLY, band="portable",
         run_verified=("cpu",), opt_in=True, tags=("deterministic",),
         formats={"k": _FORMATS, "kv": _FORMATS})(store_kv)
register("attention", "decode", **_KW, plan=DecodePlan,
         description="Batched page gather + one SDPA for all decode rows (CPU).")
register("attention", "extend", **_KW, plan=ExtendPlan,
         description="Batched page gather + one SDPA per request (CPU).")
