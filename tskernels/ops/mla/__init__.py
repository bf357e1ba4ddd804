"""Absorbed DeepSeek MLA over a paged latent cache: decode and extend.

kv_cache [num_pages, page_size, kv_lora_rank + rope_dim] (bf16/fp16/fp32, or fp8-e4m3 with a
float32 per-tensor kv_scale) holds per token the latent c_kv then the roped key; q carries the
absorbed W_UK part then its rope part; o = softmax(scale * q . row) @ rows[:, :kv_lora_rank].
All heads share the one latent row per token.
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, planned as _planned, select
from .._common import load_backends
from ..shared.host_lengths import host_copies, host_lengths

BACKENDS = load_backends(__name__, __path__)


def _problem(q, kv_cache, page_table, seq_lens, batch, kv_lora_rank, kv_scale):
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    _check.tensor("kv_cache", kv_cache, ndim=3, dtypes=_check.FLOAT_OR_FP64 + _check.FP8,
                  device=q.device, contiguous_last=True)
    if kv_cache.shape[2] != q.shape[2]:
        raise ValueError(f"kv_cache: row width {kv_cache.shape[2]} != q's {q.shape[2]}")
    if not 0 < kv_lora_rank < q.shape[2]:
        raise ValueError(f"kv_lora_rank: expected 0 < rank < {q.shape[2]}, got {kv_lora_rank}")
    _check.tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,),
                  shape=(batch, None), device=q.device)
    _check.tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), shape=(batch,),
                  device=q.device)
    fp8 = kv_cache.dtype in _check.FP8
    if fp8 and kv_scale is None:
        raise ValueError("kv_scale: required when the latent cache is fp8")
    if kv_scale is not None:
        _check.tensor("kv_scale", kv_scale, dtypes=(torch.float32,), device=q.device)
        if kv_scale.numel() != 1:
            raise ValueError(f"kv_scale: expected one per-tensor value, got {tuple(kv_scale.shape)}")
    kv = fmt(kv_cache.dtype) + (":per_tensor" if fp8 else "")
    return dict(device=q.device, formats={"q": fmt(q.dtype), "kv": kv},
                traits={"kv_lora_rank": kv_lora_rank, "rope_dim": q.shape[2] - kv_lora_rank,
                        "page_size": kv_cache.shape[1], "num_heads": q.shape[1],
                        "cache_like_q": fp8 or kv_cache.dtype == q.dtype})


def decode(q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
           seq_lens: torch.Tensor, *, scale: float, kv_lora_rank: int = 512,
           kv_scale: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """One query token per request over its paged latent rows.

    q: [B, H, kv_lora_rank + rope_dim]; page_table int32 [B, max_pages]; seq_lens int32 [B]
    (0 gives o = 0). Returns o [B, H, kv_lora_rank] in q's dtype.
    """
    prob = _problem(q, kv_cache, page_table, seq_lens, q.shape[0], kv_lora_rank, kv_scale)
    return select("mla", "decode", backend=backend, **prob)(
        q, kv_cache, page_table, seq_lens, scale=scale, kv_lora_rank=kv_lora_rank,
        kv_scale=kv_scale)


def extend(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
           page_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
           causal: bool = True, kv_lora_rank: int = 512, kv_scale: torch.Tensor | None = None,
           backend: str | None = None) -> torch.Tensor:
    """Ragged new tokens (rows qo_indptr[b]:qo_indptr[b+1], already in the cache at positions
    seq_lens[b]-n_b..seq_lens[b]-1) over their paged latent prefix and themselves.

    q: [T, H, kv_lora_rank + rope_dim]; qo_indptr int32 [B + 1]. Returns o [T, H, kv_lora_rank].
    Reads qo_indptr on the host (a sync on a GPU); `extend_plan` takes host copies instead.
    """
    _check.tensor("qo_indptr", qo_indptr, ndim=1, dtypes=(torch.int32,), device=q.device)
    prob = _problem(q, kv_cache, page_table, seq_lens, qo_indptr.shape[0] - 1, kv_lora_rank,
                    kv_scale)
    return select("mla", "extend", backend=backend, **prob)(
        q, kv_cache, qo_indptr, page_table, seq_lens, scale=scale, causal=causal,
        kv_lora_rank=kv_lora_rank, kv_scale=kv_scale)


def decode_plan(page_table: torch.Tensor, seq_lens: torch.Tensor, *, num_heads: int,
                kv_cache: torch.Tensor, scale: float, q_dtype: torch.dtype = torch.bfloat16,
                kv_lora_rank: int = 512, max_seq_len: int | None = None,
                num_splits: int | None = None, backend: str | None = None):
    """Plan MLA decode once per batch; `plan.run(q, kv_cache, *, kv_scale=None, out=None)`
    (no host sync, no allocation given `out`: CUDA-graph capturable with the Triton backend)."""
    q_like = torch.empty(0, num_heads, kv_cache.shape[2], dtype=q_dtype, device=kv_cache.device)
    fp8 = kv_cache.dtype in _check.FP8
    scale_like = torch.ones(1, device=kv_cache.device) if fp8 else None
    prob = _problem(q_like, kv_cache, page_table, seq_lens, page_table.shape[0], kv_lora_rank,
                    scale_like)
    kern = select("mla", "decode", backend=backend, **prob)
    kw = dict(num_heads=num_heads, kv_lora_rank=kv_lora_rank, scale=scale,
              rope_dim=kv_cache.shape[2] - kv_lora_rank, page_size=kv_cache.shape[1],
              max_seq_len=max_seq_len, kv_dtype=kv_cache.dtype, q_dtype=q_dtype)
    if num_splits is not None:
        kw["num_splits"] = num_splits
    return _planned(kern)(page_table, seq_lens, **kw)


def extend_plan(qo_indptr: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, *,
                num_heads: int, kv_cache: torch.Tensor, scale: float,
                q_dtype: torch.dtype = torch.bfloat16, causal: bool = True,
                kv_lora_rank: int = 512, host_qo_indptr=None, host_seq_lens=None,
                backend: str | None = None):
    """Plan an MLA extend batch once, shared by every layer; `plan.run(q, kv_cache, *,
    kv_scale=None, out=None)` returns o [T, H, kv_lora_rank]. Arguments as in `extend` and
    `decode_plan` (kv_cache: any layer's cache, for its shape and dtype).

    The plan needs the new-token counts on the host (its grid and split workspace depend on
    them, never `run`). host_qo_indptr [B + 1], host_seq_lens [B]: host copies of qo_indptr
    and seq_lens (lists, numpy arrays or CPU tensors of ints; both or neither), which the
    caller promises hold the tensors' values (only their lengths are checked: comparing the
    values would read the device); with them the plan reads nothing back from the device.
    Without them it reads both tensors once (on a GPU, a sync with the stream), as the
    one-shot `extend` does on every call.

    >>> import torch; from tskernels import mla
    >>> cache = torch.randn(4, 16, 80)
    >>> qo, lens = [0, 3], [20]
    >>> plan = mla.extend_plan(torch.tensor(qo, dtype=torch.int32),
    ...                        torch.tensor([[1, 2]], dtype=torch.int32),
    ...                        torch.tensor(lens, dtype=torch.int32), num_heads=8,
    ...                        kv_cache=cache, scale=0.1, q_dtype=torch.float32, kv_lora_rank=64,
    ...                        host_qo_indptr=qo, host_seq_lens=lens, backend="reference")
    >>> plan.run(torch.randn(3, 8, 80), cache).shape
    torch.Size([3, 8, 64])
    """
    _check.tensor("qo_indptr", qo_indptr, ndim=1, dtypes=(torch.int32,),
                  device=kv_cache.device)
    B = qo_indptr.shape[0] - 1
    q_like = torch.empty(0, num_heads, kv_cache.shape[2], dtype=q_dtype, device=kv_cache.device)
    fp8 = kv_cache.dtype in _check.FP8
    scale_like = torch.ones(1, device=kv_cache.device) if fp8 else None
    prob = _problem(q_like, kv_cache, page_table, seq_lens, B, kv_lora_rank, scale_like)
    host = host_copies(host_qo_indptr, host_seq_lens, B)
    ptr, lens = host if host is not None else host_lengths(qo_indptr, seq_lens)
    kern = select("mla", "extend", backend=backend, **prob)
    return _planned(kern)(qo_indptr, page_table, seq_lens, num_heads=num_heads,
                          kv_lora_rank=kv_lora_rank, rope_dim=kv_cache.shape[2] - kv_lora_rank,
                          page_size=kv_cache.shape[1], scale=scale, causal=causal,
                          kv_dtype=kv_cache.dtype, q_dtype=q_dtype, host_qo_indptr=ptr,
                          host_seq_lens=lens)
