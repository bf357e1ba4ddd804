"""Triton pieces around the gated delta rule in a GDN layer: the short depthwise causal conv1d
with its rolling per-sequence state (ragged prefill + decode update) and the gates.

Prefill runs in two launches: the conv over (64-token chunk, channel block) programs, which read
a sequence's old state for its first W-1 positions, then the state update per (sequence, channel
block). The split is what makes the in-place update safe: a later chunk of a sequence must not
overwrite the state its first chunk still has to read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared.ragged import block_offsets, locate_block, search_steps

CONV_FORMATS = {"x": ("fp32", "fp16", "bf16")}
MAX_WIDTH = 8
BD = 128  # channels per program (a Python int: passed as the BD constexpr)
TOK = 16  # tokens per program: [16, 128] tiles keep the W shifted loads in registers
# AMD CDNA (gfx942 / gfx950) launches the same tiles at 4 waves: no dot, 4 KB of LDS, and wave
# 64 halves the values a lane holds (150 VGPRs vs sm_90's 255 registers; no scratch)


@triton.jit
def _silu(y):
    return y / (1.0 + tl.exp(-y))


@triton.jit
def _conv_kernel(x_ptr, w_ptr, b_ptr, state_ptr, slot_ptr, y_ptr, cu_ptr, coff_ptr, N, D,
                 W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                 SILU: tl.constexpr, LOG_N: tl.constexpr, BD: tl.constexpr,
                 TOK: tl.constexpr):
    c = tl.program_id(0)
    if c >= tl.load(coff_ptr + N):
        return
    n = locate_block(coff_ptr, c, N, LOG_N)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    t = (c - tl.load(coff_ptr + n)).to(tl.int64) * TOK + tl.arange(0, TOK)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    md = d < D
    acc = tl.zeros([TOK, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + d, mask=md, other=0.0).to(tl.float32)[None, :]
    if HAS_STATE:
        slot = tl.load(slot_ptr + n).to(tl.int64)
    for i in tl.static_range(W):
        src = t - (W - 1) + i  # position in the sequence; < 0: from the state
        xm = (src >= 0) & (t < length)
        xv = tl.load(x_ptr + (bos + src)[:, None] * D + d[None, :], mask=xm[:, None] & md[None, :],
                     other=0.0).to(tl.float32)
        if HAS_STATE:
            sm = (src < 0) & (t < length)
            sv = tl.load(state_ptr + (slot * D + d[None, :]) * (W - 1) + (W - 1 + src)[:, None],
                         mask=sm[:, None] & md[None, :], other=0.0).to(tl.float32)
            xv += sv
        acc += xv * tl.load(w_ptr + d * W + i, mask=md, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = _silu(acc)
    tl.store(y_ptr + (bos + t)[:, None] * D + d[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(t < length)[:, None] & md[None, :])


@triton.jit
def _conv_state_kernel(x_ptr, state_ptr, slot_ptr, cu_ptr, D, W: tl.constexpr,
                       WP: tl.constexpr, BD: tl.constexpr):
    """state[slot] <- the last W-1 inputs of the sequence (old columns where it is shorter)."""
    n = tl.program_id(0)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    slot = tl.load(slot_ptr + n).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    j = tl.arange(0, WP)
    m = (d < D)[:, None] & (j < W - 1)[None, :]
    src = length - (W - 1) + j  # sequence position of new column j
    sp = state_ptr + (slot * D + d[:, None]) * (W - 1)
    old = tl.load(sp + (W - 1 + src)[None, :], mask=m & (src < 0)[None, :], other=0.0)
    new = tl.load(x_ptr + (bos + src)[None, :] * D + d[:, None], mask=m & (src >= 0)[None, :],
                  other=0.0)
    tl.debug_barrier()  # every old column is read before any is overwritten
    tl.store(sp + j[None, :], tl.where((src >= 0)[None, :], new.to(old.dtype), old), mask=m)


@triton.jit
def _conv_update_kernel(x_ptr, w_ptr, b_ptr, state_ptr, slot_ptr, y_ptr, D, W: tl.constexpr,
                        WP: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                        BD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    md = d < D
    j = tl.arange(0, WP)
    x = tl.load(x_ptr + b * D + d, mask=md, other=0.0)
    sp = state_ptr + (slot * D + d[:, None]) * (W - 1)
    # window column j (j < W): state column j for j < W-1, then x
    win = tl.load(sp + j[None, :], mask=md[:, None] & (j < W - 1)[None, :], other=0.0)
    win = tl.where((j == W - 1)[None, :], x[:, None], win).to(tl.float32)
    wt = tl.load(w_ptr + d[:, None] * W + j[None, :], mask=md[:, None] & (j < W)[None, :],
                 other=0.0).to(tl.float32)
    y = tl.sum(win * wt, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + d, mask=md, other=0.0).to(tl.float32)
    if SILU:
        y = _silu(y)
    tl.store(y_ptr + b * D + d, y.to(y_ptr.dtype.element_ty), mask=md)
    shifted = tl.load(sp + (j + 1)[None, :], mask=md[:, None] & (j + 1 < W - 1)[None, :],
                      other=0.0)
    shifted = tl.where((j == W - 2)[None, :], x[:, None], shifted)
    tl.debug_barrier()
    tl.store(sp + j[None, :], shifted.to(state_ptr.dtype.element_ty),
             mask=md[:, None] & (j < W - 1)[None, :])


@triton.jit
def _gate_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, numel, H: tl.constexpr,
                 BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < numel
    h = i % H
    x = tl.load(a_ptr + i, mask=m, other=0.0).to(tl.float32) + \
        tl.load(dtb_ptr + h, mask=m, other=0.0).to(tl.float32)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's softplus
    g = -tl.exp(tl.load(alog_ptr + h, mask=m, other=0.0).to(tl.float32)) * sp
    bb = tl.load(b_ptr + i, mask=m, other=0.0).to(tl.float32)
    tl.store(g_ptr + i, g, mask=m)
    tl.store(beta_ptr + i, (1.0 / (1.0 + tl.exp(-bb))).to(beta_ptr.dtype.element_ty), mask=m)


def _width_ok(w: int) -> bool:
    return 2 <= w <= MAX_WIDTH


@register("gdn", "causal_conv1d", **TRITON, formats=CONV_FORMATS, traits={"width": _width_ok},
          tags=("deterministic",), compile_cases=lambda: _conv_cases())
def causal_conv1d(x, weight, bias=None, *, cu_seqlens, conv_state=None, state_slots=None,
                  activation="silu"):
    """Triton ragged causal depthwise conv1d (+ in-place rolling state)."""
    total, dim = x.shape
    width = weight.shape[1]
    num_seqs = cu_seqlens.shape[0] - 1
    x, weight = x.contiguous(), weight.contiguous()
    cu = cu_seqlens.to(torch.int32).contiguous()
    coff = block_offsets(cu, TOK)
    y = torch.empty_like(x)
    has_state = conv_state is not None
    st = conv_state if has_state else x
    slots = state_slots.contiguous() if has_state else cu
    grid_d = triton.cdiv(dim, BD)
    log_n = search_steps(num_seqs)
    _conv_kernel[(total // TOK + num_seqs, grid_d)](
        x, weight, bias if bias is not None else weight, st, slots, y, cu, coff, num_seqs, dim,
        W=width, HAS_BIAS=bias is not None, HAS_STATE=has_state, SILU=activation == "silu",
        LOG_N=log_n, BD=BD, TOK=TOK, num_warps=4)
    if has_state:
        _conv_state_kernel[(num_seqs, grid_d)](x, conv_state, slots, cu, dim, W=width,
                                               WP=triton.next_power_of_2(width), BD=BD,
                                               num_warps=4)
    return y


@register("gdn", "causal_conv1d_update", **TRITON, formats=CONV_FORMATS,
          traits={"width": _width_ok}, tags=("deterministic", "latency"),
          compile_cases=lambda: _update_cases())
def causal_conv1d_update(x, conv_state, weight, bias=None, *, state_slots, activation="silu"):
    """Triton causal conv1d decode update (one token per sequence, state rolled in place)."""
    batch, dim = x.shape
    width = weight.shape[1]
    y = torch.empty_like(x)
    if batch:
        _conv_update_kernel[(batch, triton.cdiv(dim, BD))](
            x.contiguous(), weight.contiguous(), bias if bias is not None else weight, conv_state,
            state_slots.contiguous(), y, dim, W=width, WP=triton.next_power_of_2(width),
            HAS_BIAS=bias is not None, SILU=activation == "silu", BD=BD, num_warps=4)
    return y


@register("gdn", "gate", **TRITON, formats={"a": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=lambda: _gate_cases())
def gate(a, b, A_log, dt_bias):
    """Triton g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), one pass."""
    heads = a.shape[1]
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(b)
    if a.numel():
        _gate_kernel[(triton.cdiv(a.numel(), 1024),)](
            a.contiguous(), b.contiguous(), A_log.contiguous(), dt_bias.contiguous(), g, beta,
            a.numel(), H=heads, BLOCK=1024, num_warps=4)
    return g, beta


def _conv_cases():
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "state_ptr": "*bf16",
           "slot_ptr": "*i32", "y_ptr": "*bf16", "cu_ptr": "*i32", "coff_ptr": "*i32",
           "N": "i32", "D": "i32"}
    st = {"x_ptr": "*bf16", "state_ptr": "*bf16", "slot_ptr": "*i32", "cu_ptr": "*i32", "D": "i32"}
    return [CompileCase(_conv_kernel, sig, dict(W=4, HAS_BIAS=True, HAS_STATE=True, SILU=True,
                                                LOG_N=4, BD=BD, TOK=TOK), num_warps=4,
                        label="conv"),
            CompileCase(_conv_state_kernel, st, dict(W=4, WP=4, BD=BD), num_warps=4,
                        label="state")]


def _update_cases():
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "state_ptr": "*bf16",
           "slot_ptr": "*i32", "y_ptr": "*bf16", "D": "i32"}
    return [CompileCase(_conv_update_kernel, sig, dict(W=4, WP=4, HAS_BIAS=True, SILU=True,
                                                       BD=BD), num_warps=4)]


def _gate_cases():
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "alog_ptr": "*fp32", "dtb_ptr": "*fp32",
           "g_ptr": "*fp32", "beta_ptr": "*bf16", "numel": "i32"}
    return [CompileCase(_gate_kernel, sig, dict(H=32, BLOCK=1024), num_warps=4)]
