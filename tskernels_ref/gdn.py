"""Gated delta rule references (Qwen3-Next / FLA semantics), chunked prefill + decode step.

Per head, state S [K, V]; per token t with log-decay g_t (<= 0) and write strength beta_t:
    S   = exp(g_t) * S
    S   = S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = S^T (scale * q_t)
"""
from __future__ import annotations

import math

import torch

from ._common import compute_dtype


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _chunk_sequence(q, k, v, g, beta, state, chunk_size):
    """One sequence in chunked (WY / UT-transform) form.

    Within a chunk with cumulative decay G_i = g_1 + ... + g_i and start state S0, the written
    values u_i = beta_i (v_i - S_{i-1}'^T k_i) satisfy (I + A) U = beta V - beta e^G K S0 with
    A_ij = beta_i e^(G_i - G_j) k_i.k_j for j < i, so with T = (I + A)^-1:
        U = T (beta V) - T (beta e^G K) S0 = U' - W S0
        O = (e^G Q) S0 + [(q_i.k_j) e^(G_i - G_j)]_{j<=i} U
        S_C = e^(G_C) S0 + sum_j e^(G_C - G_j) k_j u_j^T
    q, k [L, H, K]; v [L, H, V]; g, beta [L, H]; state [H, K, V] (all in the compute dtype).
    """
    length, heads, _ = k.shape
    num_chunks = -(-length // chunk_size)
    pad = num_chunks * chunk_size - length

    def chunks(x):  # [L, H, ...] -> [num_chunks, H, C, ...]; padded tokens are no-ops
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
        x = x.reshape(num_chunks, chunk_size, heads, *x.shape[2:])
        return x.transpose(1, 2)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    gc = chunks(g[..., None])[..., 0]
    bc = chunks(beta[..., None])[..., 0]
    G = gc.cumsum(dim=-1)
    tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool).tril()
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~tril, float("-inf"))
    decay = diff.exp()  # e^(G_i - G_j) for j <= i, else 0
    eye = torch.eye(chunk_size, dtype=q.dtype)
    A = (bc[..., None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
    T = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    W = T @ ((bc * G.exp())[..., None] * kc)
    U_prime = T @ (bc[..., None] * vc)
    QK = (qc @ kc.transpose(-1, -2)) * decay
    last = G[..., -1]
    out = torch.empty_like(U_prime)
    for c in range(num_chunks):
        U = U_prime[c] - W[c] @ state
        out[c] = (G[c].exp()[..., None] * qc[c]) @ state + QK[c] @ U
        k_decayed = kc[c] * (last[c][:, None] - G[c]).exp()[..., None]
        state = last[c].exp()[:, None, None] * state + k_decayed.transpose(-1, -2) @ U
    out = out.transpose(1, 2).reshape(num_chunks * chunk_size, heads, -1)[:length]
    return out, state


def chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over a ragged batch of sequences, chunked form.

    Args:
        q, k: [T, H, K] (T = cu_seqlens[-1]).
        v: [T, H, V].
        g: float32 [T, H], log decay (<= 0).
        beta: [T, H].
        cu_seqlens: int32 [N+1].
        initial_state: float32 [N, H, K, V] or None (zeros).
        scale: query scale, default 1/sqrt(K).
        chunk_size: tokens per chunk (math is identical for any value).
        use_qk_l2norm: L2-normalize q and k per head first (Qwen3-Next does).
    Returns:
        (o [T, H, V] in q.dtype, final_state float32 [N, H, K, V] (float64 for float64 inputs)).
    """
    dtype = compute_dtype(q, k, v)
    _, heads, dk = k.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    qf, kf = q.to(dtype), k.to(dtype)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf = qf * scale
    vf, gf, bf = v.to(dtype), g.to(dtype), beta.to(dtype)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    num_seqs = len(bounds) - 1
    o = torch.zeros(q.shape[0], heads, dv, dtype=dtype)
    final = torch.zeros(num_seqs, heads, dk, dv, dtype=dtype)
    for n in range(num_seqs):
        start, end = bounds[n], bounds[n + 1]
        state = torch.zeros(heads, dk, dv, dtype=dtype) if initial_state is None else initial_state[n].to(dtype)
        if end > start:
            o[start:end], state = _chunk_sequence(
                qf[start:end], kf[start:end], vf[start:end], gf[start:end], bf[start:end], state, chunk_size
            )
        final[n] = state
    return o.to(q.dtype), final


def decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> torch.Tensor:
    """One recurrent step per sequence; state rows state_slots are updated in place.

    Args:
        q, k: [B, H, K].
        v: [B, H, V].
        g: float32 [B, H] log decay.
        beta: [B, H].
        state: float32 [num_slots, H, K, V], read and written at rows state_slots.
        state_slots: int32 [B] (distinct).
        scale: query scale, default 1/sqrt(K).
        use_qk_l2norm: L2-normalize q and k per head first.
    Returns:
        o [B, H, V] in q.dtype.
    """
    dtype = compute_dtype(q, k, v, state)
    scale = 1.0 / math.sqrt(k.shape[-1]) if scale is None else float(scale)
    qf, kf = q.to(dtype), k.to(dtype)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    slots = state_slots.long()
    S = state[slots].to(dtype) * g.to(dtype).exp()[..., None, None]
    err = v.to(dtype) - torch.einsum("bhkv,bhk->bhv", S, kf)
    S = S + torch.einsum("bhk,bhv->bhkv", kf, beta.to(dtype)[..., None] * err)
    o = torch.einsum("bhkv,bhk->bhv", S, qf * scale)
    state[slots] = S.to(state.dtype)
    return o.to(q.dtype)
