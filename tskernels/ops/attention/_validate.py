"""Shared argument checks of the attention family (public boundary only), and the extend
plans' host copies of their lengths (`host_copies` at the boundary, `host_lengths` in a plan;
shared with the MLA family from `ops/shared/host_lengths.py`)."""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt
from ..shared.host_lengths import host_copies, host_lengths  # noqa: F401 (this family's API)

KV_DTYPES = _check.FLOAT_OR_FP64 + _check.FP8
# cache formats the Triton kernels take (an fp8 cache with per-tensor or per-KV-head scales)
KV_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3:per_tensor", "fp8_e4m3:per_head")


def kv_cache(k_cache, v_cache, *, head_dim=None, device=None):
    # the kernels address a cache row as (page, slot, head) strides + a contiguous head_dim
    _check.tensor("k_cache", k_cache, ndim=4, dtypes=KV_DTYPES, device=device,
                  contiguous_last=True)
    _check.tensor("v_cache", v_cache, shape=tuple(k_cache.shape), dtypes=(k_cache.dtype,),
                  device=k_cache.device, contiguous_last=True)
    if head_dim is not None and k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: head_dim {k_cache.shape[3]} != q's head_dim {head_dim}")
    return k_cache.shape  # num_pages, page_size, num_kv_heads, head_dim


def scales(k_cache, k_scale, v_scale):
    fp8 = k_cache.dtype in _check.FP8
    hkv = k_cache.shape[2]
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            if fp8:
                raise ValueError(f"{name}: required when the KV cache is fp8")
            continue
        _check.tensor(name, s, dtypes=(torch.float32,), device=k_cache.device)
        if s.numel() not in (1, hkv):
            raise ValueError(f"{name}: expected 1 (per-tensor) or {hkv} (per-head) elements, "
                             f"got shape {tuple(s.shape)}")
    if not fp8 or k_scale is None:
        return None
    return "per_tensor" if k_scale.numel() == 1 else "per_head"


def paged(page_table, seq_lens, batch, device):
    _check.tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), shape=(batch, None),
                  device=device)
    _check.tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), shape=(batch,),
                  device=device)


def options(q_heads, softcap, sliding_window, sinks, device):
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap: expected a positive cap or None, got {softcap}")
    if sliding_window is not None and not (isinstance(sliding_window, int) and sliding_window > 0):
        raise ValueError(f"sliding_window: expected a positive int or None, got {sliding_window}")
    _check.optional("sinks", sinks, shape=(q_heads,), dtypes=(torch.float32,), device=device)


def problem(q, k_cache, scale_mode, *, softcap, sliding_window, sinks, decode=False):
    num_pages, page_size, hkv, d = k_cache.shape
    kv = fmt(k_cache.dtype) + (f":{scale_mode}" if scale_mode else "")
    return dict(device=q.device, formats={"q": fmt(q.dtype), "kv": kv},
                traits={"head_dim": d, "page_size": page_size, "gqa": q.shape[-2] // hkv,
                        # (request, KV head) pairs of a decode batch (q [B, Hq, D])
                        "kv_programs": q.shape[0] * hkv if decode else None,
                        "softcap": softcap is not None, "sliding_window": sliding_window is not None,
                        "sinks": sinks is not None})


def gqa(q_heads, kv_heads):
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q has {q_heads} heads, not a multiple of the cache's {kv_heads} "
                         "KV heads (GQA needs num_q_heads % num_kv_heads == 0)")


def query_problem(q, k_cache, v_cache, page_table, seq_lens, batch, *, softcap, sliding_window,
                  sinks, k_scale, v_scale, decode=False):
    """Every check of a decode/extend call against its paged cache; returns select()'s problem."""
    hq, d = q.shape[1], q.shape[2]
    kv_cache(k_cache, v_cache, head_dim=d, device=q.device)
    gqa(hq, k_cache.shape[2])
    paged(page_table, seq_lens, batch, q.device)
    options(hq, softcap, sliding_window, sinks, q.device)
    mode = scales(k_cache, k_scale, v_scale)
    return problem(q, k_cache, mode, softcap=softcap, sliding_window=sliding_window, sinks=sinks,
                   decode=decode)


def new_kv(k, v, num_rows, k_cache):
    """The new tokens' own K/V handed to extend next to the cache they were stored in: both or
    neither, [T, Hkv, D] in the cache's (16-bit or fp32) dtype, each head's row contiguous."""
    if k is None and v is None:
        return False
    if k is None or v is None:
        raise ValueError("k, v: pass both of the new tokens' K and V, or neither")
    if k_cache.dtype in _check.FP8:
        raise ValueError("k, v: only for 16-bit / fp32 caches (an fp8 cache holds quantized "
                         "values, which the kernel must read)")
    _, _, hkv, d = k_cache.shape
    for name, t in (("k", k), ("v", v)):
        _check.tensor(name, t, shape=(num_rows, hkv, d), dtypes=(k_cache.dtype,),
                      device=k_cache.device)
        if (hkv > 1 and t.stride(1) != d) or t.stride(2) != 1:
            raise ValueError(f"{name}: each row's heads must be packed ([T, Hkv, D] with "
                             f"strides (any, D, 1)), got strides {tuple(t.stride())}")
    return True
