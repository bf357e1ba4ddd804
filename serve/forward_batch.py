"""One step's batch as the layers see it: positions, slots, and the attention state whose plans
are built once per step and reused by every layer.

The scheduler orders rows decodes first (one token each), then prefill chunks, so the first
`num_decode` tokens are decode tokens: they go through the decode plan, the rest through one
ragged extend plan (chunked prefill with a cached prefix is the same op).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import tskernels
from tskernels import GQACacheSpec, KVCacheSpec, MLACacheSpec

from .models import bound_ops

# Decode-only steps on a GPU with a 16-bit / fp32 cache run each layer's q/k norm (Qwen3) +
# RoPE + K/V store as one launch (attention.rope_store_kv) instead of two to four; False: the
# separate ops (an A/B: benchmarks/serve_ab.py --set serve.forward_batch.FUSED_ROPE_STORE=False).
# Read when a step's AttentionState is built (CUDA graphs: at capture).
FUSED_ROPE_STORE = True


class KVPool:
    """The paged cache of every layer, allocated from the model's `KVCacheSpec`. GQA: k/v
    [L, num_pages, page_size, Hkv, D]; MLA (latent): kv [L, num_pages, page_size, width].
    Page 0 is the scheduler's null page (padding)."""

    def __init__(self, spec: KVCacheSpec, num_pages: int, page_size: int, dtype: torch.dtype,
                 device):
        if not isinstance(spec, (GQACacheSpec, MLACacheSpec)):
            raise TypeError(f"KVPool: cache kind {type(spec).__name__} is not served (expected "
                            "GQACacheSpec or MLACacheSpec)")
        self.spec, self.num_pages, self.page_size, self.dtype = spec, num_pages, page_size, dtype
        self.fp8 = dtype == torch.float8_e4m3fn
        tensors = spec.allocate(num_pages, page_size, dtype, device)
        if isinstance(spec, GQACacheSpec):
            self.k, self.v = tensors
        else:
            (self.kv,) = tensors
        # fp8 pools use unit per-tensor scales (no calibration data for random or bf16 weights)
        self.scale = torch.ones(1, dtype=torch.float32, device=device) if self.fp8 else None

    @property
    def is_mla(self) -> bool:
        return isinstance(self.spec, MLACacheSpec)

    @staticmethod
    def bytes_per_token(spec: KVCacheSpec, dtype: torch.dtype) -> int:
        return spec.bytes_per_token(dtype)


@dataclass
class StepMeta:
    """Device tensors of one plan (or of a CUDA-graph's static buffers)."""

    positions: torch.Tensor     # int32 [T]
    slot_mapping: torch.Tensor  # int64 [T]
    qo_indptr: torch.Tensor     # int32 [R+1]
    page_table: torch.Tensor    # int32 [R, P]
    seq_lens: torch.Tensor      # int32 [R]
    num_decode: int
    num_requests: int
    max_seq_len: int | None = None  # decode plan sizing (graphs: max_model_len)
    # the host arrays qo_indptr / seq_lens were uploaded from: the extend plan reads these
    # instead of the device tensors (no sync); None where there are none (graph buffers)
    host_qo_indptr: np.ndarray | None = None
    host_seq_lens: np.ndarray | None = None

    def extend_host(self) -> dict:
        """extend_plan's host copies of the extend rows (after the decode rows), if known."""
        nd = self.num_decode
        if self.host_qo_indptr is None or self.host_seq_lens is None:
            return {}
        return dict(host_qo_indptr=self.host_qo_indptr[nd:] - nd,
                    host_seq_lens=self.host_seq_lens[nd:])


def fuses_rope_store(pool: KVPool, num_decode: int, num_requests: int) -> bool:
    """Whether a step's PagedAttention layers take attention.rope_store_kv (FUSED_ROPE_STORE):
    decode-only steps (the extend kernel reads the new tokens' rotated K/V), a 16-bit / fp32
    cache (an fp8 cache's quantize-on-write is store_kv's), a GPU (the CPU binds its own
    store)."""
    return (FUSED_ROPE_STORE and not pool.is_mla and not pool.fp8 and num_decode > 0 and
            num_requests == num_decode and pool.k[0].device.type != "cpu")


def _cpu_store(dtype, hkv, d, fp8):
    """The store_kv kernel the public op would select for this cache (under the active kernel
    policy), bound once."""
    kv = "fp8_e4m3:per_tensor" if fp8 else tskernels.fmt(dtype)
    return bound_ops.bind(("store_kv", dtype, hkv, d, fp8), "attention", "store_kv",
                          lambda: dict(formats={"k": tskernels.fmt(dtype), "kv": kv},
                                       traits={"head_dim": d}))


class AttentionState:
    """Plans for one step, shared by all layers; `forward` / `forward_mla` per layer."""

    def __init__(self, pool: KVPool, meta: StepMeta, *, num_q_heads: int, q_dtype,
                 mla_scale: float | None = None, kv_lora_rank: int | None = None):
        self.pool, self.meta = pool, meta
        self._store = None
        if not pool.is_mla and pool.k[0].device.type == "cpu":
            like = pool.k[0]
            self._store = _cpu_store(like.dtype, like.shape[2], like.shape[3], pool.fp8)
        nd, nr = meta.num_decode, meta.num_requests
        self.num_decode_tokens = nd
        mode = "per_tensor" if pool.fp8 else None
        self._plan_args = dict(num_q_heads=num_q_heads, q_dtype=q_dtype, kv_scale_mode=mode)
        self._windowed: dict[int, tuple] = {}   # sliding window W -> (decode, extend) plans
        self.decode = self.extend = None
        self.fuse_rope_store = fuses_rope_store(pool, nd, nr)
        if not pool.is_mla:
            like = pool.k[0]
            if nd:
                self.decode = tskernels.attention.decode_plan(
                    meta.page_table[:nd], meta.seq_lens[:nd], num_q_heads=num_q_heads,
                    k_cache=like, q_dtype=q_dtype, kv_scale_mode=mode,
                    max_seq_len=meta.max_seq_len)
            if nr > nd:
                self.extend = tskernels.attention.extend_plan(
                    meta.qo_indptr[nd:] - nd, meta.page_table[nd:], meta.seq_lens[nd:],
                    num_q_heads=num_q_heads, k_cache=like, q_dtype=q_dtype, kv_scale_mode=mode,
                    **meta.extend_host())
        else:
            like = pool.kv[0]
            if nd:
                self.decode = tskernels.mla.decode_plan(
                    meta.page_table[:nd], meta.seq_lens[:nd], num_heads=num_q_heads,
                    kv_cache=like, scale=mla_scale, q_dtype=q_dtype, kv_lora_rank=kv_lora_rank,
                    max_seq_len=meta.max_seq_len)
            if nr > nd:
                self.extend = tskernels.mla.extend_plan(
                    meta.qo_indptr[nd:] - nd, meta.page_table[nd:], meta.seq_lens[nd:],
                    num_heads=num_q_heads, kv_cache=like, scale=mla_scale, q_dtype=q_dtype,
                    kv_lora_rank=kv_lora_rank, **meta.extend_host())

    def plans(self, sliding_window: int | None = None) -> tuple:
        """(decode, extend) plans of this step for layers attending to all keys (None) or to
        their last `sliding_window` keys; windowed plans are built on a layer's first call and
        shared by every layer with that window (CUDA graphs: during the warm-up run)."""
        if sliding_window is None:
            return self.decode, self.extend
        got = self._windowed.get(sliding_window)
        if got is None:
            m, nd, a = self.meta, self.num_decode_tokens, self._plan_args
            like = self.pool.k[0]
            dec = ext = None
            if self.decode is not None:
                dec = tskernels.attention.decode_plan(
                    m.page_table[:nd], m.seq_lens[:nd], k_cache=like, max_seq_len=m.max_seq_len,
                    sliding_window=sliding_window, **a)
            if self.extend is not None:
                ext = tskernels.attention.extend_plan(
                    m.qo_indptr[nd:] - nd, m.page_table[nd:], m.seq_lens[nd:], k_cache=like,
                    sliding_window=sliding_window, **a, **m.extend_host())
            got = self._windowed[sliding_window] = (dec, ext)
        return got

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                sliding_window: int | None = None):
        """Store the new tokens' K/V, then attend (to the last `sliding_window` keys only when
        given). q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]."""
        decode, extend = self.plans(sliding_window)
        p, s = self.pool, self.pool.scale
        kc, vc = p.k[layer], p.v[layer]
        if self._store is not None:  # the CPU backend's store, bound once (shapes fixed)
            self._store(k, v, kc, vc, self.meta.slot_mapping, k_scale=s, v_scale=s)
        else:
            tskernels.attention.store_kv(k, v, kc, vc, self.meta.slot_mapping, k_scale=s,
                                         v_scale=s)
        nd = self.num_decode_tokens
        if extend is None:
            return decode.run(q, kc, vc, k_scale=s, v_scale=s)
        # the new tokens' own K/V as well (same values as just stored; a 16-bit / fp32 cache
        # holds them unquantised): the extend kernel reads them contiguously and only the
        # cached prefix through the page table
        new = {} if p.fp8 else dict(k=k[nd:], v=v[nd:])
        if decode is None:
            return extend.run(q, kc, vc, k_scale=s, v_scale=s, **new)
        o = torch.empty_like(q)
        decode.run(q[:nd], kc, vc, k_scale=s, v_scale=s, out=o[:nd])
        extend.run(q[nd:], kc, vc, k_scale=s, v_scale=s, out=o[nd:], **new)
        return o

    def forward_rope_store(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           positions: torch.Tensor, cos_sin_cache: torch.Tensor, *, style: str,
                           q_norm_weight: torch.Tensor | None = None,
                           k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                           sliding_window: int | None = None) -> torch.Tensor:
        """A decode-only step (`fuse_rope_store`): per-head q/k RMSNorm (given the weights) +
        RoPE + the K/V store in one launch, then the decode plan. q [T, Hq, D], k/v [T, Hkv, D]
        as projected (before norm and RoPE) -> [T, Hq, D]."""
        decode, _ = self.plans(sliding_window)
        kc, vc = self.pool.k[layer], self.pool.v[layer]
        q = bound_ops.rope_store_kv(q, k, v, positions, cos_sin_cache, kc, vc,
                                    self.meta.slot_mapping, style=style,
                                    q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                                    eps=eps)
        return decode.run(q, kc, vc)

    def forward_mla(self, layer: int, q: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Store the latent rows [T, W], attend with absorbed q [T, H, W] -> [T, H, kv_lora].
        The softmax scale and kv_lora_rank are the step's plans' (the runner's, which checks at
        load that every MLA layer has the same)."""
        cache, s = self.pool.kv[layer], self.pool.scale
        tskernels.kvcache.store_mla(latent, cache, self.meta.slot_mapping, kv_scale=s)
        nd = self.num_decode_tokens
        parts = []
        if self.decode is not None:
            parts.append(self.decode.run(q[:nd], cache, kv_scale=s))
        if self.extend is not None:
            parts.append(self.extend.run(q[nd:], cache, kv_scale=s))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class ForwardBatch:
    positions: torch.Tensor
    attention: AttentionState
