"""Gated delta rule references (Qwen3-Next / FLA semantics): chunked prefill, decode step, and
the pieces a GDN layer runs around them (short causal conv1d with its rolling state, gating).

Per value head, state S [K, V]; per token t with log-decay g_t (<= 0) and write strength beta_t:
    S   = exp(g_t) * S
    S   = S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = S^T (scale * q_t)
q and k have HK heads, v / g / beta / the state HV heads, HV a multiple of HK: value head h reads
key head h // (HV // HK) (grouped value heads, as Qwen3-Next's 16 key / 32 value heads).
"""
from __future__ import annotations

import math

import torch

from ._common import compute_dtype


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _value_heads(x: torch.Tensor, value_heads: int) -> torch.Tensor:
    """[N, HK, D] -> [N, HV, D]: value head h reads key head h // (HV // HK)."""
    return x.repeat_interleave(value_heads // x.shape[1], dim=1)


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
    tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~tril, float("-inf"))
    decay = diff.exp()  # e^(G_i - G_j) for j <= i, else 0
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
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
        q, k: [T, HK, K] (T = cu_seqlens[-1]).
        v: [T, H, V], H a multiple of HK.
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
    dk = k.shape[-1]
    _, heads, dv = v.shape
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    qf, kf = q.to(dtype), k.to(dtype)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _value_heads(qf * scale, heads), _value_heads(kf, heads)
    vf, gf, bf = v.to(dtype), g.to(dtype), beta.to(dtype)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    num_seqs = len(bounds) - 1
    o = torch.zeros(q.shape[0], heads, dv, dtype=dtype, device=q.device)
    final = torch.zeros(num_seqs, heads, dk, dv, dtype=dtype, device=q.device)
    for n in range(num_seqs):
        start, end = bounds[n], bounds[n + 1]
        state = torch.zeros(heads, dk, dv, dtype=dtype, device=q.device) if initial_state is None \
            else initial_state[n].to(dtype)
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
        q, k: [B, HK, K].
        v: [B, H, V], H a multiple of HK.
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
    qf, kf = _value_heads(qf, v.shape[1]), _value_heads(kf, v.shape[1])
    slots = state_slots.long()
    S = state[slots].to(dtype) * g.to(dtype).exp()[..., None, None]
    err = v.to(dtype) - torch.einsum("bhkv,bhk->bhv", S, kf)
    S = S + torch.einsum("bhk,bhv->bhkv", kf, beta.to(dtype)[..., None] * err)
    o = torch.einsum("bhkv,bhk->bhv", S, qf * scale)
    state[slots] = S.to(state.dtype)
    return o.to(q.dtype)


def gate(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's gates from the projections: g = -exp(A_log) * softplus(a + dt_bias) (the log
    decay, <= 0) and beta = sigmoid(b).

    Args:
        a, b: [N, H] (any float dtype; N tokens).
        A_log, dt_bias: [H].
    Returns:
        (g float32 [N, H], beta [N, H] in b's dtype); float64 for float64 inputs.
    """
    dtype = compute_dtype(a, b, A_log, dt_bias)
    sp = torch.nn.functional.softplus(a.to(dtype) + dt_bias.to(dtype))
    g = -torch.exp(A_log.to(dtype)) * sp
    beta = torch.sigmoid(b.to(dtype))
    return g, beta.to(b.dtype)


def _conv_act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return torch.nn.functional.silu(y) if activation == "silu" else y


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    state_slots: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Depthwise causal conv1d over a ragged batch, with an optional rolling state per sequence.

    y_t[d] = act(bias[d] + sum_i weight[d, i] * x_{t - (W-1) + i}[d]); inputs before a sequence's
    first token come from its state (conv_state[slot, d, j] holds x_{-(W-1) + j}), zeros without
    one. With conv_state, each sequence's state is replaced in place by its last W-1 inputs
    (for a sequence shorter than W-1 the old state shifts left; an empty one keeps its state).

    Args:
        x: [T, D]; sequence n owns rows cu_seqlens[n]:cu_seqlens[n+1].
        weight: [D, W]. bias: [D] or None.
        cu_seqlens: int32 [N+1].
        conv_state: [num_slots, D, W-1] (x's dtype) or None; state_slots: int [N] (distinct), given
            with conv_state.
        activation: "silu" or None.
    Returns:
        y [T, D] in x's dtype.
    """
    dtype = compute_dtype(x, weight, bias)
    width = weight.shape[1]
    w = weight.to(dtype)
    bounds = [int(v) for v in cu_seqlens.tolist()]
    y = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for n in range(len(bounds) - 1):
        s, e = bounds[n], bounds[n + 1]
        if conv_state is not None:
            prev = conv_state[int(state_slots[n])].to(dtype).T  # [W-1, D]
        else:
            prev = torch.zeros(width - 1, x.shape[1], dtype=dtype, device=x.device)
        seq = torch.cat([prev, x[s:e].to(dtype)])  # [W-1 + L, D]
        for t in range(e - s):
            acc = (seq[t: t + width] * w.T).sum(0)
            if bias is not None:
                acc = acc + bias.to(dtype)
            y[s + t] = acc
        if conv_state is not None:
            conv_state[int(state_slots[n])] = seq[seq.shape[0] - (width - 1):].T.to(conv_state.dtype)
    return _conv_act(y, activation).to(x.dtype)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    state_slots: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode token per sequence through the causal conv1d; the state rolls in place.

    Args:
        x: [B, D]. conv_state: [num_slots, D, W-1], rows state_slots read and replaced by
            (their last W-2 columns, x). weight: [D, W]. bias: [D] or None.
        state_slots: int [B] (distinct). activation: "silu" or None.
    Returns:
        y [B, D] in x's dtype.
    """
    dtype = compute_dtype(x, weight, bias)
    slots = state_slots.long()
    window = torch.cat([conv_state[slots].to(dtype), x.to(dtype)[:, :, None]], dim=2)  # [B, D, W]
    y = (window * weight.to(dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    conv_state[slots] = window[:, :, 1:].to(conv_state.dtype)
    return _conv_act(y, activation).to(x.dtype)
