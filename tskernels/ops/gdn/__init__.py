"""Gated delta rule (Qwen3-Next / FLA semantics): chunked prefill and the recurrent decode step.

Per head, state S [K, V]; per token t with log decay g_t (<= 0) and write strength beta_t:

    S   = exp(g_t) * S
    S   = S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = S^T (scale * q_t)

H heads, K key/query head dim, V value head dim. States are float32 (float64 allowed for
ground-truth runs).
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from . import reference  # noqa: F401  (register backends)

STATE_DTYPES = (torch.float32, torch.float64)


def _qkv(q, k, v, g, beta) -> tuple[int, int, int, int]:
    """Checks q, k [N, H, K], v [N, H, V], g, beta [N, H]; returns (N, H, K, V)."""
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    n, heads, dk = q.shape
    _check.tensor("k", k, shape=(n, heads, dk), dtypes=(q.dtype,), device=q.device,
                  contiguous_last=True)
    _check.tensor("v", v, ndim=3, shape=(n, heads, None), dtypes=(q.dtype,), device=q.device,
                  contiguous_last=True)
    _check.tensor("g", g, shape=(n, heads), dtypes=STATE_DTYPES, device=q.device)
    _check.tensor("beta", beta, shape=(n, heads), dtypes=_check.FLOAT_OR_FP64, device=q.device)
    return n, heads, dk, v.shape[2]


def _scale(scale) -> None:
    if scale is not None and not scale > 0:
        raise ValueError(f"scale: expected a positive float or None, got {scale}")


def _problem(q, state, heads, dk, dv) -> dict:
    formats = {"q": fmt(q.dtype)}
    if state is not None:
        formats["state"] = fmt(state.dtype)
    return dict(device=q.device, formats=formats,
                traits={"num_heads": heads, "head_dim_k": dk, "head_dim_v": dv})


def chunk_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, *, cu_seqlens: torch.Tensor,
                  initial_state: torch.Tensor | None = None, scale: float | None = None,
                  chunk_size: int = 64, use_qk_l2norm: bool = False,
                  backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a ragged batch of N sequences (chunked WY / UT form; the result
    does not depend on chunk_size beyond rounding).

    q, k: [T, H, K] fp32/fp16/bf16 (T = cu_seqlens[-1]). v: [T, H, V], q's dtype.
    g: float32 [T, H], log decay (<= 0). beta: [T, H] float. cu_seqlens: int32 [N + 1],
    sequence n owns rows cu_seqlens[n]:cu_seqlens[n+1]; it must start at 0, never decrease and
    end at T (checked only when it is on the CPU: elsewhere the check would synchronise).
    initial_state: float32 [N, H, K, V] or None (zeros). scale: positive, default 1/sqrt(K).
    chunk_size: positive. use_qk_l2norm: L2-normalize q and k per head first (Qwen3-Next).
    All tensors on one device. Returns (o [T, H, V] in q's dtype, final_state float32
    [N, H, K, V]).
    """
    tokens, heads, dk, dv = _qkv(q, k, v, g, beta)
    _check.tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32,), device=q.device)
    if cu_seqlens.shape[0] < 2:
        raise ValueError("cu_seqlens: expected N + 1 >= 2 entries (one sequence at least), "
                         f"got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type == "cpu":
        b = cu_seqlens.tolist()
        if b[0] != 0 or b[-1] != tokens or any(x > y for x, y in zip(b, b[1:])):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T={tokens}, "
                             f"got {b}")
    num_seqs = cu_seqlens.shape[0] - 1
    _check.optional("initial_state", initial_state, shape=(num_seqs, heads, dk, dv),
                    dtypes=STATE_DTYPES, device=q.device)
    _scale(scale)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    kern = select("gdn", "chunk_prefill", backend=backend,
                  **_problem(q, initial_state, heads, dk, dv))
    return kern(q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                scale=scale, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm)


def decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, state: torch.Tensor, state_slots: torch.Tensor, *,
                scale: float | None = None, use_qk_l2norm: bool = False,
                backend: str | None = None) -> torch.Tensor:
    """One recurrent step for each of B sequences; state rows state_slots are updated in place.

    q, k: [B, H, K] fp32/fp16/bf16. v: [B, H, V], q's dtype. g: float32 [B, H] log decay.
    beta: [B, H] float. state: float32 [num_slots, H, K, V], read and written at rows
    state_slots. state_slots: int32/int64 [B], distinct, each in [0, num_slots) (checked only
    when on the CPU: elsewhere the check would synchronise). scale: positive, default
    1/sqrt(K). use_qk_l2norm: L2-normalize q and k per head first. All on one device.
    Returns o [B, H, V] in q's dtype.
    """
    batch, heads, dk, dv = _qkv(q, k, v, g, beta)
    _check.tensor("state", state, ndim=4, shape=(None, heads, dk, dv), dtypes=STATE_DTYPES,
                  device=q.device)
    _check.tensor("state_slots", state_slots, dtypes=_check.INDEX, shape=(batch,),
                  device=q.device)
    if state_slots.device.type == "cpu" and batch:
        slots = state_slots.tolist()
        if min(slots) < 0 or max(slots) >= state.shape[0]:
            raise ValueError(f"state_slots: expected values in [0, {state.shape[0]}) "
                             f"(state has {state.shape[0]} slots), got {slots}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"state_slots: expected distinct slots, got {slots}")
    _scale(scale)
    kern = select("gdn", "decode_step", backend=backend, **_problem(q, state, heads, dk, dv))
    return kern(q, k, v, g, beta, state, state_slots, scale=scale, use_qk_l2norm=use_qk_l2norm)
