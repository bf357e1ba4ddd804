"""Paged attention: write K/V into pages (optionally with q/k norm + RoPE), decode, extend
(prefill and chunked prefill).

KV cache layout per layer: k_cache, v_cache [num_pages, page_size, num_kv_heads, head_dim]
(bf16/fp16/fp32, or fp8-e4m3 with float32 k_scale/v_scale, per tensor [1] or per head
[num_kv_heads]). page_table int32 [batch, max_pages]; seq_lens int32 [batch] = tokens in the
cache per request (for extend: prefix + new tokens). GQA: query head h reads KV head
h // (num_q_heads // num_kv_heads).
"""
from __future__ import annotations

import functools
import warnings

import torch

from ... import _check
from ...plan import AttentionParams
from ...registry import fmt, planned as _planned, select
from . import _validate as _v
from .._common import load_backends

BACKENDS = load_backends(__name__, __path__)


def _renamed(old: str, new: str):
    """Accept the keyword `old` for `new` for one release, with a DeprecationWarning."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if old in kwargs:
                warnings.warn(f"{fn.__name__}: the keyword {old!r} is deprecated, use {new!r}",
                              DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return wrapper
    return deco


@_renamed("v_", "v")
def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None, backend: str | None = None) -> None:
    """Write new tokens' K/V into their cache slots, in place.

    k, v: [T, num_kv_heads, head_dim] (`v_=` is accepted with a DeprecationWarning).
    slot_mapping: int64 [T], page * page_size + offset;
    negative slots are skipped (padding). For an fp8 cache, values are quantized on write:
    clamp(x / scale, +-448) -> e4m3, with k_scale/v_scale float32 [1] or [num_kv_heads].
    """
    _check.tensor("k", k, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    T, hkv, d = k.shape
    _check.tensor("v", v, shape=(T, hkv, d), dtypes=(k.dtype,), device=k.device,
                  contiguous_last=True)
    _v.kv_cache(k_cache, v_cache, head_dim=d, device=k.device)
    if k_cache.shape[2] != hkv:
        raise ValueError(f"k_cache: {k_cache.shape[2]} KV heads, k has {hkv}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache/v_cache: must be contiguous")
    _check.tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,), shape=(T,),
                  device=k.device)
    mode = _v.scales(k_cache, k_scale, v_scale)
    kv = fmt(k_cache.dtype) + (f":{mode}" if mode else "")
    kern = select("attention", "store_kv", device=k.device,
                  formats={"k": fmt(k.dtype), "kv": kv}, traits={"head_dim": d},
                  backend=backend)
    kern(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)


def rope_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, *, style: str = "neox",
                  q_norm_weight: torch.Tensor | None = None,
                  k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                  backend: str | None = None) -> torch.Tensor:
    """A decode step's q/k preparation and K/V write as one op: per-head RMSNorm of q and k
    (optional, Qwen3), RoPE of q and k (`rope.apply_rope`), then `store_kv` of the rotated k
    and v. The result equals those ops run one after the other, roundings included.

    q: [T, Hq, D]; k, v: [T, Hkv, D] (fp32/fp16/bf16, one dtype; any strides on the first two
    dims, e.g. views of the qkv projection, last dim contiguous). positions: int32/int64 [T].
    cos_sin_cache: fp32 [max_position, r] (`rope.cos_sin_cache`, r even, r <= D: dims past r
    are not rotated). style: "neox" / "gptj". k_cache, v_cache: the paged cache (16-bit or fp32,
    contiguous; an fp8 cache is refused: its quantize-on-write stays with `store_kv`).
    slot_mapping: int64 [T], negative slots skipped (padding; their q is still rotated).
    q_norm_weight, k_norm_weight: [D] both or neither, with eps. Returns q_out [T, Hq, D] (new).
    """
    _check.one_of("style", style, ("neox", "gptj"))
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    T, _, d = q.shape
    _check.tensor("k", k, ndim=3, dtypes=(q.dtype,), shape=(T, None, d), device=q.device,
                  contiguous_last=True)
    hkv = k.shape[1]
    _check.tensor("v", v, shape=(T, hkv, d), dtypes=(q.dtype,), device=q.device,
                  contiguous_last=True)
    _check.tensor("positions", positions, ndim=1, dtypes=_check.INDEX, shape=(T,),
                  device=q.device)
    _check.tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=(torch.float32, torch.float64),
                  device=q.device)
    r = cos_sin_cache.shape[1]
    if r % 2 or r > d:
        raise ValueError(f"cos_sin_cache: width {r} must be even and <= head_dim {d}")
    _v.kv_cache(k_cache, v_cache, head_dim=d, device=q.device)
    if k_cache.dtype in _check.FP8:
        raise ValueError("k_cache: an fp8 cache is not supported by rope_store_kv (its "
                         "quantize-on-write is store_kv's); use rope.apply_rope + store_kv")
    if k_cache.shape[2] != hkv:
        raise ValueError(f"k_cache: {k_cache.shape[2]} KV heads, k has {hkv}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache/v_cache: must be contiguous")
    _check.tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,), shape=(T,),
                  device=q.device)
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight/k_norm_weight: give both (per-head q/k RMSNorm) or "
                         "neither")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        _check.optional(name, w, shape=(d,), dtypes=_check.FLOAT_OR_FP64, device=q.device)
    kern = select("attention", "rope_store_kv", device=q.device,
                  formats={"q": fmt(q.dtype), "kv": fmt(k_cache.dtype)},
                  traits={"head_dim": d, "style": style, "qk_norm": q_norm_weight is not None},
                  backend=backend)
    return kern(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, style=style,
                q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, eps=eps)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           page_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float | None = None,
           sliding_window: int | None = None, softcap: float | None = None,
           sinks: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
           v_scale: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """One query token per request against its paged KV.

    q: [B, Hq, D]. scale: softmax scale (default 1/sqrt(D)). sliding_window W: attend to the
    last W keys only. softcap c: logits = c * tanh(logits / c). sinks: float32 [Hq], one extra
    logit per head in the softmax denominator. A request with seq_len 0 gets zeros.
    Returns o [B, Hq, D] in q's dtype.
    """
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    B, hq, d = q.shape
    prob = _v.query_problem(q, k_cache, v_cache, page_table, seq_lens, B, softcap=softcap,
                           sliding_window=sliding_window, sinks=sinks, k_scale=k_scale,
                           v_scale=v_scale, decode=True)
    return select("attention", "decode", backend=backend, **prob)(
        q, k_cache, v_cache, page_table, seq_lens, scale=scale or d ** -0.5,
        sliding_window=sliding_window, softcap=softcap, sinks=sinks, k_scale=k_scale,
        v_scale=v_scale)


def decode_plan(page_table: torch.Tensor, seq_lens: torch.Tensor, *, num_q_heads: int,
                k_cache: torch.Tensor, q_dtype: torch.dtype = torch.bfloat16,
                scale: float | None = None, sliding_window: int | None = None,
                softcap: float | None = None, sinks: bool = False,
                kv_scale_mode: str | None = None, max_seq_len: int | None = None,
                num_splits: int | None = None, backend: str | None = None):
    """Plan a batch of decode steps once; `plan.run(q, k_cache, v_cache, ...)` per layer.

    page_table int32 [B, max_pages] and seq_lens int32 [B] are kept by reference (update them
    in place between CUDA-graph replays). k_cache gives the cache's shape and dtype.
    kv_scale_mode: "per_tensor" / "per_head" for an fp8 cache. max_seq_len: the longest
    sequence the plan will see (sizes the split; default max_pages * page_size, no sync).
    num_splits: override the split-KV factor. `run(q, k_cache, v_cache, *, sinks=None,
    k_scale=None, v_scale=None, out=None)` returns o [B, Hq, D]; with the Triton backend it
    neither synchronises nor allocates (given `out`), so it can be captured in a CUDA graph.

    >>> import torch, tskernels.ops.attention as attn
    >>> kc = torch.randn(4, 16, 2, 64); vc = torch.randn(4, 16, 2, 64)
    >>> plan = attn.decode_plan(torch.tensor([[1, 2]], dtype=torch.int32),
    ...                         torch.tensor([20], dtype=torch.int32), num_q_heads=8,
    ...                         k_cache=kc, q_dtype=torch.float32, backend="reference")
    >>> plan.run(torch.randn(1, 8, 64), kc, vc).shape
    torch.Size([1, 8, 64])
    """
    B = page_table.shape[0]
    _, page_size, hkv, d = k_cache.shape
    params = AttentionParams(scale=scale, sliding_window=sliding_window, softcap=softcap,
                             sinks=sinks)
    _v.gqa(num_q_heads, hkv)
    _v.paged(page_table, seq_lens, B, k_cache.device)
    kern = _select_planned("decode", k_cache, num_q_heads, q_dtype, params, kv_scale_mode,
                           backend, batch=B)
    kw = dict(num_q_heads=num_q_heads, num_kv_heads=hkv, head_dim=d, page_size=page_size,
              q_dtype=q_dtype, kv_dtype=k_cache.dtype, max_seq_len=max_seq_len,
              **params.plan_kwargs(d))
    if num_splits is not None:
        kw["num_splits"] = num_splits
    return _planned(kern)(page_table, seq_lens, **kw)


def extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           qo_indptr: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, *,
           causal: bool = True, scale: float | None = None, sliding_window: int | None = None,
           softcap: float | None = None, sinks: torch.Tensor | None = None,
           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
           k: torch.Tensor | None = None, v: torch.Tensor | None = None,
           backend: str | None = None) -> torch.Tensor:
    """New tokens of a ragged batch attending to their paged prefix and themselves.

    q: [T, Hq, D]; qo_indptr: int32 [B + 1] (request b owns q rows qo_indptr[b]:qo_indptr[b+1]).
    The new tokens' K/V must already be in the cache (`store_kv` first); request b's new tokens
    sit at positions seq_lens[b] - n_b .. seq_lens[b] - 1. causal: each token sees keys up to
    its own position. Other options as in `decode`. Returns o [T, Hq, D] in q's dtype.
    Serves prefill (no prefix) and chunked prefill alike.
    k, v: optionally the new tokens' own K/V ([T, Hkv, D], each row's heads packed, any row
    stride; the values just stored, so a 16-bit or fp32 cache only): a backend that can reads
    the new tokens' keys from them contiguously (Triton: tensor descriptors, TMA on sm_90+) and
    only the prefix through the page table. The result is the same either way.
    """
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    T, hq, d = q.shape
    _check.tensor("qo_indptr", qo_indptr, ndim=1, dtypes=(torch.int32,), device=q.device)
    B = qo_indptr.shape[0] - 1
    if B < 0:
        raise ValueError("qo_indptr: needs at least one element (batch + 1)")
    prob = _v.query_problem(q, k_cache, v_cache, page_table, seq_lens, B, softcap=softcap,
                           sliding_window=sliding_window, sinks=sinks, k_scale=k_scale,
                           v_scale=v_scale)
    new_kv = {}
    if _v.new_kv(k, v, T, k_cache):
        new_kv = dict(k=k, v=v)
    prob["traits"] = dict(prob["traits"], causal=causal, new_kv=bool(new_kv),
                          prefix=_has_prefix(qo_indptr, seq_lens))
    return select("attention", "extend", backend=backend, **prob)(
        q, k_cache, v_cache, qo_indptr, page_table, seq_lens, causal=causal,
        scale=scale or d ** -0.5, sliding_window=sliding_window, softcap=softcap, sinks=sinks,
        k_scale=k_scale, v_scale=v_scale, **new_kv)


def extend_plan(qo_indptr: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, *,
                num_q_heads: int, k_cache: torch.Tensor, q_dtype: torch.dtype = torch.bfloat16,
                causal: bool = True, scale: float | None = None,
                sliding_window: int | None = None, softcap: float | None = None,
                sinks: bool = False, kv_scale_mode: str | None = None,
                host_qo_indptr=None, host_seq_lens=None, backend: str | None = None):
    """Plan an extend batch once; `plan.run(q, k_cache, v_cache, *, sinks=None, k_scale=None,
    v_scale=None, out=None)` returns o [T, Hq, D]. Arguments as in `extend` and `decode_plan`.

    The plan needs the batch's lengths on the host (the backend, the split choice and the work
    list depend on them, never `run`). host_qo_indptr [B + 1], host_seq_lens [B]: host copies
    of qo_indptr and seq_lens (lists, numpy arrays or CPU tensors of ints; both or neither),
    which the caller promises hold the tensors' values (only their lengths are checked:
    comparing the values would read the device); with them the plan reads nothing back from
    the device. Without them it reads both tensors once (on a GPU, a sync with the stream).

    >>> import torch, tskernels.ops.attention as attn
    >>> kc = torch.randn(4, 16, 2, 64); vc = torch.randn(4, 16, 2, 64)
    >>> qo, lens = [0, 3], [20]
    >>> plan = attn.extend_plan(torch.tensor(qo, dtype=torch.int32),
    ...                         torch.tensor([[1, 2]], dtype=torch.int32),
    ...                         torch.tensor(lens, dtype=torch.int32), num_q_heads=8, k_cache=kc,
    ...                         q_dtype=torch.float32, host_qo_indptr=qo, host_seq_lens=lens,
    ...                         backend="reference")
    >>> plan.run(torch.randn(3, 8, 64), kc, vc).shape
    torch.Size([3, 8, 64])
    """
    B = qo_indptr.shape[0] - 1
    _, page_size, hkv, d = k_cache.shape
    params = AttentionParams(scale=scale, causal=causal, sliding_window=sliding_window,
                             softcap=softcap, sinks=sinks)
    _v.gqa(num_q_heads, hkv)
    _v.paged(page_table, seq_lens, B, k_cache.device)
    host = _v.host_copies(host_qo_indptr, host_seq_lens, B)
    if host is None:
        host = _v.host_lengths(qo_indptr, seq_lens)
    ptr, lens = host
    kern = _select_planned("extend", k_cache, num_q_heads, q_dtype, params, kv_scale_mode,
                           backend, extra={"causal": causal, "prefix": _has_prefix(ptr, lens)})
    return _planned(kern)(qo_indptr, page_table, seq_lens, num_q_heads=num_q_heads,
                          num_kv_heads=hkv, head_dim=d, page_size=page_size, q_dtype=q_dtype,
                          kv_dtype=k_cache.dtype, host_qo_indptr=ptr, host_seq_lens=lens,
                          **params.plan_kwargs(d, with_causal=True))


def _has_prefix(qo_indptr, seq_lens) -> bool:
    """Whether any request of an extend batch has cached tokens before its new ones (backends
    that serve prefill only select on it). Tensors (a host read when on a device: the one-shot
    `extend`) or their host copies (`extend_plan`)."""
    if len(qo_indptr) < 2:
        return False
    return bool((seq_lens != qo_indptr[1:] - qo_indptr[:-1]).any())


def _select_planned(op, k_cache, num_q_heads, q_dtype, params: AttentionParams, kv_scale_mode,
                    backend, batch=None, extra=None):
    _, page_size, hkv, d = k_cache.shape
    if (k_cache.dtype in _check.FP8) != (kv_scale_mode is not None):
        raise ValueError("kv_scale_mode: give 'per_tensor' or 'per_head' exactly when the "
                         f"cache is fp8 (cache dtype {k_cache.dtype}, got {kv_scale_mode!r})")
    kv = fmt(k_cache.dtype) + (f":{kv_scale_mode}" if kv_scale_mode else "")
    return select("attention", op, device=k_cache.device, formats={"q": fmt(q_dtype), "kv": kv},
                  traits={"head_dim": d, "page_size": page_size, "gqa": num_q_heads // hkv,
                          "kv_programs": None if batch is None else batch * hkv,
                          **params.traits(), **(extra or {})},
                  backend=backend)


def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                 lse_b: torch.Tensor, *, backend: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets (split-KV).

    o_a, o_b: [N, H, D]; lse_a, lse_b: float32 [N, H] natural-log sum of exp of the logits.
    Returns (o, lse) of the union.
    """
    _check.tensor("o_a", o_a, ndim=3, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("o_b", o_b, shape=tuple(o_a.shape), dtypes=(o_a.dtype,), device=o_a.device)
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        _check.tensor(name, t, shape=tuple(o_a.shape[:2]), dtypes=(torch.float32, torch.float64),
                      device=o_a.device)
    kern = select("attention", "merge_states", device=o_a.device,
                  formats={"o": fmt(o_a.dtype)}, backend=backend)
    return kern(o_a, lse_a, o_b, lse_b)
