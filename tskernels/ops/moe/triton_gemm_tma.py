"""The aligned path's grouped GEMMs with the expert weights read through tensor descriptors
(TMA on sm_90+): a lab form of triton_gemm's gate_up_kernel / down_kernel, switched on by
`triton_experts.TMA_WEIGHTS` (off until it is measured faster on the GPU).

Why: the weights are the operand both GEMMs stream per row block; with pointer loads each
[BLOCK_N, BLOCK_K] tile costs the warps address arithmetic and one cp.async per 16 bytes, where
one TMA copy per tile leaves them to the MMAs (the prefill layer's GEMMs run at 440-490 TFLOP/s
on the H200 against cuBLAS-class ~700). The gate-up's A operand stays a pointer gather (its rows
are tokens picked by sorted_token_ids); the down's A (the activations in aligned row order) is
contiguous, so it is read through a descriptor too. Weights are viewed as 2-D [E * rows, K]
(their experts contiguous, which the launcher checks): a tile's rows past its expert's last
belong to the next expert or lie past the tensor (zeros) and only reach masked-off columns.
Separate kernels rather than a switch inside triton_gemm's, whose source hash keys the shipped
tuned table (autotune): the measured kernels stay byte-for-byte what the table was tuned on.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_gemm import _gelu_tanh, _round_e4m3, _tile_ids


@triton.jit
def gate_up_tma_kernel(x_ptr, w_ptr, act_ptr, xs_ptr, ws_ptr, acts_ptr, sorted_ptr,
                       expert_ptr, total_ptr, numel, num_m, I, H, W_ROWS, stride_xt,
                       stride_wn, stride_ar, stride_xst, stride_wse, stride_wsn, stride_asr,
                       TOP_K: tl.constexpr, FP8: tl.constexpr, GELU: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):
    """triton_gemm.gate_up_kernel with w13 [E, 2I, H] read as a [W_ROWS = E * 2I, H]
    descriptor: gate rows e * 2I + n, up rows e * 2I + I + n."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    wd = tl.make_tensor_descriptor(w_ptr, shape=[W_ROWS, H], strides=[stride_wn, 1],
                                   block_shape=[BLOCK_N, BLOCK_K])
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < numel
    tok = (flat // TOP_K).to(tl.int64)
    e = tl.load(expert_ptr + pid_m)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_g = e * 2 * I + pid_n * BLOCK_N
    row_u = row_g + I
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * stride_xt + k[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FP8:
        n_w = (n % I).to(tl.int64)
        as_ptrs = xs_ptr + tok * stride_xst
        gs_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (n_w // 128) * stride_wsn
        us_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + ((n_w + I) // 128) * stride_wsn
    for kk in range(0, tl.cdiv(H, BLOCK_K)):
        k_ok = k < H - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        bg = wd.load([row_g, kk * BLOCK_K])  # columns past H: zeros (the descriptor's edge)
        bu = wd.load([row_u, kk * BLOCK_K])
        if FP8:
            sa = tl.load(as_ptrs + kk, mask=valid, other=0.0)
            sg = tl.load(gs_ptrs + kk)
            su = tl.load(us_ptrs + kk)
            acc_g += tl.dot(a, bg.T) * sa[:, None] * sg[None, :]
            acc_u += tl.dot(a, bu.T) * sa[:, None] * su[None, :]
        else:
            acc_g = tl.dot(a, bg.T, acc_g)
            acc_u = tl.dot(a, bu.T, acc_u)
        a_ptrs += BLOCK_K
    if GELU:
        act = _gelu_tanh(acc_g) * acc_u
    else:
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    out_ptrs = act_ptr + rows.to(tl.int64)[:, None] * stride_ar + n[None, :]
    n_ok = n[None, :] < I
    if FP8:
        amax = tl.max(tl.where(n_ok, tl.abs(act), 0.0), axis=1)
        scale = tl.maximum(amax, 1e-10) / 448.0
        q = _round_e4m3(tl.clamp(act / scale[:, None], -448.0, 448.0))
        tl.store(out_ptrs, q.to(act_ptr.dtype.element_ty), mask=n_ok)
        tl.store(acts_ptr + rows.to(tl.int64) * stride_asr + pid_n, scale)
    else:
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def down_tma_kernel(a_ptr, w_ptr, y_ptr, as_ptr, ws_ptr, topk_w_ptr, sorted_ptr, expert_ptr,
                    total_ptr, numel, num_m, H, I, A_ROWS, W_ROWS, stride_ar, stride_wn,
                    stride_yf, stride_asr, stride_wse, stride_wsn,
                    FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """triton_gemm.down_kernel with act [A_ROWS, I] and w2 [E, H, I] (as [W_ROWS = E * H, I])
    read through descriptors."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    ad = tl.make_tensor_descriptor(a_ptr, shape=[A_ROWS, I], strides=[stride_ar, 1],
                                   block_shape=[BLOCK_M, BLOCK_K])
    wd = tl.make_tensor_descriptor(w_ptr, shape=[W_ROWS, I], strides=[stride_wn, 1],
                                   block_shape=[BLOCK_N, BLOCK_K])
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < numel
    e = tl.load(expert_ptr + pid_m)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_w = e * H + pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FP8:
        n_w = (n % H).to(tl.int64)
        as_ptrs = as_ptr + rows.to(tl.int64) * stride_asr
        bs_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (n_w // 128) * stride_wsn
    for kk in range(0, tl.cdiv(I, BLOCK_K)):
        a = ad.load([pid_m * BLOCK_M, kk * BLOCK_K])
        b = wd.load([row_w, kk * BLOCK_K])
        if FP8:
            sa = tl.load(as_ptrs + kk)
            sb = tl.load(bs_ptrs + kk)
            acc += tl.dot(a, b.T) * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b.T, acc)
    w = tl.load(topk_w_ptr + flat, mask=valid, other=0.0)
    acc = acc * w[:, None]
    y_ptrs = y_ptr + flat.to(tl.int64)[:, None] * stride_yf + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & (n[None, :] < H))
