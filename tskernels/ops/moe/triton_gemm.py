"""Triton grouped GEMMs of the fused experts, over the rows `align_by_expert` laid out.

Row r of the aligned layout (r < max_padded) holds flat id f = sorted_token_ids[r] (token
f // k, routing slot f % k), or the sentinel T*k on padding rows; block b = r // BLOCK_M
belongs to expert expert_ids[b]. Blocks at or past num_tokens_post_padded exit at once, so the
grid is sized by max_padded (no host sync) and only routed rows do work.

gate_up: act[r] = silu(x[f // k] W_gate^T) * (x[f // k] W_up^T). Each program owns BLOCK_N
act columns and runs two accumulators (gate rows n, up rows I + n) over the same x tile, so the
[rows, 2I] pre-activation never reaches memory. act is stored in the aligned row order: the
down GEMM then reads its A tile as contiguous rows, no gather. With fp8 weights the epilogue
quantizes act per 1 x 128 group (BLOCK_N = 128: the group is the tile's row) and stores the
group scales beside it.

down: y[f] = topk_weight[f] * act[r] W2^T, stored at flat row f ([T*k, H]); the k rows of a
token are summed by the combine kernel (a fixed order: deterministic, unlike atomics).

fp8 (DeepSeek-V3 block scales): weights e4m3 with one fp32 scale per 128 x 128 block,
activations e4m3 with one scale per 1 x 128 group; each BLOCK_K = 128 step multiplies the fp32
partial product by a_scale[row] * w_scale[n // 128].
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row blocks sweep the column tiles together (A tiles reused
    from L2 across the N tiles, one expert's weights across its consecutive row blocks)."""
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _gelu_tanh(x):
    # tanh via exp: 0.5 x (1 + tanh(u)) = x * sigmoid(2u)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def _round_e4m3(q):
    """q rounded to 3 mantissa bits (nearest, ties to even) in fp32, so the e4m3 conversion
    after it is exact for normal values. The same result as a direct conversion on hardware;
    Triton's interpreter converts without carrying a rounded-up mantissa into the exponent
    (125.0 -> 64.0), so the kernel rounds first on every target."""
    bits = q.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def gate_up_kernel(x_ptr, w_ptr, act_ptr, xs_ptr, ws_ptr, acts_ptr, sorted_ptr, expert_ptr,
                   total_ptr, numel, num_m, I, H, stride_xt, stride_we, stride_wn,
                   stride_ar, stride_xst, stride_wse, stride_wsn, stride_asr,
                   TOP_K: tl.constexpr, FP8: tl.constexpr, GELU: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < numel
    tok = (flat // TOP_K).to(tl.int64)
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_w = (n % I).to(tl.int64)  # columns past I re-read valid rows; their stores are masked
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * stride_xt + k[None, :]
    g_ptrs = w_ptr + e * stride_we + n_w[None, :] * stride_wn + k[:, None]
    u_ptrs = g_ptrs + I * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FP8:
        as_ptrs = xs_ptr + tok * stride_xst
        gs_ptrs = ws_ptr + e * stride_wse + (n_w // 128) * stride_wsn
        us_ptrs = ws_ptr + e * stride_wse + ((n_w + I) // 128) * stride_wsn
    for kk in range(0, tl.cdiv(H, BLOCK_K)):
        k_ok = k < H - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        bg = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
        bu = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        if FP8:
            sa = tl.load(as_ptrs + kk, mask=valid, other=0.0)
            sg = tl.load(gs_ptrs + kk)
            su = tl.load(us_ptrs + kk)
            acc_g += tl.dot(a, bg) * sa[:, None] * sg[None, :]
            acc_u += tl.dot(a, bu) * sa[:, None] * su[None, :]
        else:
            acc_g = tl.dot(a, bg, acc_g)
            acc_u = tl.dot(a, bu, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if GELU:
        act = _gelu_tanh(acc_g) * acc_u
    else:
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    out_ptrs = act_ptr + rows.to(tl.int64)[:, None] * stride_ar + n[None, :]
    n_ok = n[None, :] < I
    if FP8:
        # BLOCK_N == 128: this tile's row is one 1 x 128 quantization group
        amax = tl.max(tl.where(n_ok, tl.abs(act), 0.0), axis=1)
        scale = tl.maximum(amax, 1e-10) / 448.0
        q = _round_e4m3(tl.clamp(act / scale[:, None], -448.0, 448.0))
        tl.store(out_ptrs, q.to(act_ptr.dtype.element_ty), mask=n_ok)
        tl.store(acts_ptr + rows.to(tl.int64) * stride_asr + pid_n, scale)
    else:
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def down_kernel(a_ptr, w_ptr, y_ptr, as_ptr, ws_ptr, topk_w_ptr, sorted_ptr, expert_ptr,
                total_ptr, numel, num_m, H, I, stride_ar, stride_we, stride_wn, stride_yf,
                stride_asr, stride_wse, stride_wsn,
                FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < numel
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_w = (n % H).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_ar + k[None, :]
    b_ptrs = w_ptr + e * stride_we + n_w[None, :] * stride_wn + k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FP8:
        as_ptrs = as_ptr + rows.to(tl.int64) * stride_asr
        bs_ptrs = ws_ptr + e * stride_wse + (n_w // 128) * stride_wsn
    for kk in range(0, tl.cdiv(I, BLOCK_K)):
        k_ok = k < I - kk * BLOCK_K
        # padding rows hold finite values (act of a zero row): no row mask needed on A
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if FP8:
            sa = tl.load(as_ptrs + kk)
            sb = tl.load(bs_ptrs + kk)
            acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    w = tl.load(topk_w_ptr + flat, mask=valid, other=0.0)
    acc = acc * w[:, None]
    y_ptrs = y_ptr + flat.to(tl.int64)[:, None] * stride_yf + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & (n[None, :] < H))


@triton.jit
def combine_kernel(y_ptr, w_ptr, id_ptr, out_ptr, H, E, stride_yt, stride_yk, stride_ot,
                   K: tl.constexpr, K_P: tl.constexpr, HAS_W: tl.constexpr,
                   HAS_IDS: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum_j (w[t, j] *) y[t, j] in fp32, j in a fixed order; with HAS_IDS, slots
    whose expert id is outside [0, E) (never written by the down GEMM) are skipped."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, K_P)
    jm = j < K
    if HAS_IDS:
        eid = tl.load(id_ptr + t * K + j, mask=jm, other=-1)
        jm = jm & (eid >= 0) & (eid < E)
    m = jm[:, None] & (h[None, :] < H)
    y = tl.load(y_ptr + t * stride_yt + j[:, None] * stride_yk + h[None, :], mask=m,
                other=0.0).to(tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + t * K + j, mask=j < K, other=0.0)
        y = y * w[:, None]
    tl.store(out_ptr + t * stride_ot + h, tl.sum(y, axis=0).to(out_ptr.dtype.element_ty),
             mask=h < H)
