"""Gated delta rule (Qwen3-Next / FLA semantics): chunked prefill, the recurrent decode step,
and the pieces of a GDN layer around them (causal conv1d with rolling state, gates).

Per value head, state S [K, V]; per token t with log decay g_t (<= 0) and write strength beta_t:

    S   = exp(g_t) * S
    S   = S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = S^T (scale * q_t)

q and k have HK heads, v, g, beta and the state H value heads (H a multiple of HK; value head h
reads key head h // (H // HK)). K key/query head dim, V value head dim. States are float32
(float64 allowed for ground-truth runs).
"""
from __future__ import annotations

import torch

from ... import _check
from ...registry import fmt, select
from .._common import load_backends

load_backends(__name__, __path__)  # reference, triton_chunk, triton_decode, triton_conv

STATE_DTYPES = (torch.float32, torch.float64)


def _qkv(q, k, v, g, beta) -> tuple[int, int, int, int]:
    """Checks q, k [N, HK, K], v [N, H, V] (H a multiple of HK), g, beta [N, H]; returns
    (N, H, K, V)."""
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    n, key_heads, dk = q.shape
    _check.tensor("k", k, shape=(n, key_heads, dk), dtypes=(q.dtype,), device=q.device,
                  contiguous_last=True)
    _check.tensor("v", v, ndim=3, shape=(n, None, None), dtypes=(q.dtype,), device=q.device,
                  contiguous_last=True)
    heads = v.shape[1]
    _check.divisible("v", heads, key_heads, "the key heads of q and k")
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

    q, k: [T, HK, K] fp32/fp16/bf16 (T = cu_seqlens[-1]). v: [T, H, V], q's dtype, H a
    multiple of HK.
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

    q, k: [B, HK, K] fp32/fp16/bf16. v: [B, H, V], q's dtype, H a multiple of HK.
    g: float32 [B, H] log decay.
    beta: [B, H] float. state: float32 [num_slots, H, K, V], contiguous, read and written at
    rows state_slots (other slots are never touched). state_slots: int32/int64 [B], distinct, each in [0, num_slots) (checked only
    when on the CPU: elsewhere the check would synchronise). scale: positive, default
    1/sqrt(K). use_qk_l2norm: L2-normalize q and k per head first. All on one device.
    Returns o [B, H, V] in q's dtype.
    """
    batch, heads, dk, dv = _qkv(q, k, v, g, beta)
    _check.tensor("state", state, ndim=4, shape=(None, heads, dk, dv), dtypes=STATE_DTYPES,
                  device=q.device)
    if not state.is_contiguous():
        raise ValueError("state: expected a contiguous state pool (its slots are updated in "
                         f"place), got strides {state.stride()}")
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


def gate(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *,
         backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's GDN gates in one pass: g = -exp(A_log) * softplus(a + dt_bias) (log decay,
    <= 0) and beta = sigmoid(b).

    a, b: [N, H] fp32/fp16/bf16 (b may differ in dtype from a). A_log, dt_bias: float [H].
    All on one device. Returns (g float32 [N, H], beta [N, H] in b's dtype).
    """
    _check.tensor("a", a, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("b", b, shape=tuple(a.shape), dtypes=_check.FLOAT_OR_FP64, device=a.device)
    heads = a.shape[1]
    _check.tensor("A_log", A_log, shape=(heads,), dtypes=_check.FLOAT_OR_FP64, device=a.device)
    _check.tensor("dt_bias", dt_bias, shape=(heads,), dtypes=_check.FLOAT_OR_FP64,
                  device=a.device)
    kern = select("gdn", "gate", backend=backend, device=a.device,
                  formats={"a": fmt(a.dtype), "b": fmt(b.dtype)}, traits={"num_heads": heads})
    return kern(a, b, A_log, dt_bias)


ACTIVATIONS = ("silu", None)


def _conv_args(x, weight, bias, conv_state, activation, name_x="x") -> tuple[int, int]:
    _check.tensor(name_x, x, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    dim = x.shape[1]
    _check.tensor("weight", weight, ndim=2, shape=(dim, None), dtypes=(x.dtype,),
                  device=x.device)
    width = weight.shape[1]
    if width < 2:
        raise ValueError(f"weight: expected a kernel width >= 2, got shape {tuple(weight.shape)}")
    _check.optional("bias", bias, shape=(dim,), dtypes=(x.dtype,), device=x.device)
    if conv_state is not None:
        _check.tensor("conv_state", conv_state, ndim=3, shape=(None, dim, width - 1),
                      dtypes=(x.dtype,), device=x.device)
        if not conv_state.is_contiguous():
            raise ValueError("conv_state: expected a contiguous tensor (it is updated in place)")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    return dim, width


def _slots(name, slots, count, num_slots, device) -> None:
    _check.tensor(name, slots, dtypes=_check.INDEX, shape=(count,), device=device)
    if slots.device.type == "cpu" and count:
        s = slots.tolist()
        if min(s) < 0 or max(s) >= num_slots:
            raise ValueError(f"{name}: expected values in [0, {num_slots}) "
                             f"(the state has {num_slots} slots), got {s}")
        if len(set(s)) != len(s):
            raise ValueError(f"{name}: expected distinct slots, got {s}")


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  cu_seqlens: torch.Tensor, conv_state: torch.Tensor | None = None,
                  state_slots: torch.Tensor | None = None, activation: str | None = "silu",
                  backend: str | None = None) -> torch.Tensor:
    """Depthwise causal conv1d over a ragged batch (the short conv of a GDN layer), with a
    rolling state per sequence:

        y_t[d] = act(bias[d] + sum_i weight[d, i] * x_(t - (W-1) + i)[d])

    Inputs before a sequence's first token come from conv_state[state_slots[n]] (column j holds
    x_(-(W-1) + j)), or are zeros without conv_state; with conv_state, each slot is replaced in
    place by the sequence's last W-1 inputs (a sequence shorter than W-1 shifts its old state;
    an empty one keeps it), so a prefill split into chunks equals one long prefill.

    x: [T, D] fp32/fp16/bf16. weight: [D, W] and bias [D] (or None) in x's dtype.
    cu_seqlens: int32 [N + 1] (checked when on the CPU). conv_state: [num_slots, D, W-1] in x's
    dtype, contiguous, or None; state_slots: int32/int64 [N], distinct, given with conv_state.
    activation: "silu" or None. Returns y [T, D] in x's dtype.
    """
    dim, width = _conv_args(x, weight, bias, conv_state, activation)
    _check.tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32,), device=x.device)
    if cu_seqlens.shape[0] < 2:
        raise ValueError("cu_seqlens: expected N + 1 >= 2 entries (one sequence at least), "
                         f"got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type == "cpu":
        b = cu_seqlens.tolist()
        if b[0] != 0 or b[-1] != x.shape[0] or any(p > q for p, q in zip(b, b[1:])):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to "
                             f"T={x.shape[0]}, got {b}")
    num_seqs = cu_seqlens.shape[0] - 1
    if (conv_state is None) != (state_slots is None):
        raise ValueError("state_slots: expected together with conv_state (both or neither)")
    if conv_state is not None:
        _slots("state_slots", state_slots, num_seqs, conv_state.shape[0], x.device)
    kern = select("gdn", "causal_conv1d", backend=backend, device=x.device,
                  formats={"x": fmt(x.dtype)}, traits={"width": width, "dim": dim})
    return kern(x, weight, bias, cu_seqlens=cu_seqlens, conv_state=conv_state,
                state_slots=state_slots, activation=activation)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, *, state_slots: torch.Tensor,
                         activation: str | None = "silu", backend: str | None = None
                         ) -> torch.Tensor:
    """One decode token per sequence through the causal conv1d; the state rolls in place:
    y = act(bias + sum_j weight[:, j] * window[:, j]) with window = (conv_state[slot], x), then
    conv_state[slot] = window[:, 1:].

    x: [B, D] fp32/fp16/bf16. conv_state: [num_slots, D, W-1] in x's dtype, contiguous.
    weight: [D, W], bias: [D] or None, in x's dtype. state_slots: int32/int64 [B], distinct
    (checked when on the CPU). activation: "silu" or None. Returns y [B, D] in x's dtype.
    """
    dim, width = _conv_args(x, weight, bias, conv_state, activation)
    _slots("state_slots", state_slots, x.shape[0], conv_state.shape[0], x.device)
    kern = select("gdn", "causal_conv1d_update", backend=backend, device=x.device,
                  formats={"x": fmt(x.dtype)}, traits={"width": width, "dim": dim})
    return kern(x, conv_state, weight, bias, state_slots=state_slots, activation=activation)
