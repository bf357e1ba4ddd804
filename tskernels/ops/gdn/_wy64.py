"""The "wy64" WY kernel of the chunked gated delta rule: the same factors as `_wy_kernel` in
triton_chunk.py (G, W = T (beta e^G K), U = T (beta V) with T = (I + A)^-1), but with every
tensor-core product 64 rows tall, so that sm_90 lowers it to wgmma instead of 16-row mma.sync:

1. A = K K^T for the whole chunk is one [64, 128] x [128, 64] product, scaled by
   beta_i e^(G_i - G_j) and masked to j < i, then written in fp32 to a per-(chunk, head)
   scratch tile;
2. the solve reads A back as 16 x 16 blocks and writes T over A in the same tile: forward
   substitution on the four diagonal blocks at once (one [4, 16, 16] tile: one 14-step chain
   instead of the fused kernel's four in a row), then the block-triangular merge, all in fp32
   FMA math as in the fused kernel;
3. T is read back whole and W, U are [64, 64] x [64, 64-column piece] products.

The scratch round trip (16 KB per program, written and re-read by the same CTA moments later,
so it should be served from L2) is what buys the 64-row tiles: Triton has no cheap way to reassemble register blocks into
one tile. The CTA barriers between the phases order the scratch stores before the loads of
other threads; the loads bypass L1 (".cg").
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..shared.ragged import block_bounds
from ._validate import CHUNK

BT = tl.constexpr(CHUNK)  # chunk length
BC = tl.constexpr(16)  # sub-block of the in-chunk solve


@triton.jit
def _inv_unit_lower(a, o):
    """(I + a)^-1 for a strictly lower-triangular [BC, BC] fp32 tile, by forward substitution:
    row i of N = T - I is -a_i + sum_(j<i) (-a_ij) N_j (rows 0 and 1 are -a's)."""
    n = -a
    for i in range(2, BC):
        row = tl.sum(tl.where((o == i)[:, None], -a, 0.0), 0)
        row = tl.where(o < i, row, 0.0)
        row = row + tl.sum(row[:, None] * n, 0)
        n = tl.where((o == i)[:, None], row[None, :], n)
    return n + (o[:, None] == o[None, :]).to(tl.float32)


@triton.jit
def _inv_unit_lower_pow(a, o):
    """`_inv_unit_lower` without the serial chain: a is strictly lower triangular [BC, BC], so
    (-a)^16 = 0 and (I + a)^-1 = sum_k (-a)^k = (I + n)(I + n^2)(I + n^4)(I + n^8) with
    n = -a: six exact fp32 products (the 14-step substitution is 28 dependent CTA-wide
    reductions)."""
    n = -a
    n2 = _mm(n, n)
    n4 = _mm(n2, n2)
    n8 = _mm(n4, n4)
    t = n + (o[:, None] == o[None, :]).to(tl.float32)
    t = t + _mm(t, n2)
    t = t + _mm(t, n4)
    return t + _mm(t, n8)


@triton.jit
def _mm(a, b):
    """fp32 product of two small fp32 tiles, exact (no tf32 rounding)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _inv_unit_lower_x4(a, o):
    """`_inv_unit_lower` for the four [BC, BC] tiles a[b] (the chunk's diagonal blocks) at
    once: one 14-step chain for all four (the fused kernel runs four one after the other)."""
    n = -a
    for i in range(2, BC):
        sel = (o == i)[None, :, None]
        row = tl.sum(tl.where(sel, -a, 0.0), 1)              # [4, BC]: row i of each -a_b
        row = tl.where((o < i)[None, :], row, 0.0)
        row = row + tl.sum(row[:, :, None] * n, 1)
        n = tl.where(sel, row[:, None, :], n)
    return n + (o[:, None] == o[None, :]).to(tl.float32)[None, :, :]


@triton.jit
def _dot(a, b, acc=None, IEEE: tl.constexpr = False):
    """a @ b (+ acc); IEEE: fp32 tiles multiplied in full fp32 rather than tf32."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _blk(sp, i: tl.constexpr, j: tl.constexpr, o):
    """Block (i, j) of the [BT, BT] fp32 scratch tile at sp."""
    r = o + i * 16
    cc = o + j * 16
    return tl.load(sp + r[:, None] * BT + cc[None, :], cache_modifier=".cg")


@triton.jit
def _put(sp, i: tl.constexpr, j: tl.constexpr, o, x):
    r = o + i * 16
    cc = o + j * 16
    tl.store(sp + r[:, None] * BT + cc[None, :], x)


@triton.jit
def _chunk_rows(coff_ptr, cu_ptr, c, N, LOG_N: tl.constexpr):
    """Chunk c (below offsets[N]): its sequence's first row bos and length, the chunk's first
    row t0 in it, the chunk's row offsets ot, its rows and their mask."""
    n, bos, length, t0 = block_bounds(coff_ptr, cu_ptr, c, N, LOG_N, BT)
    ot = tl.arange(0, BT)
    return bos, length, t0, ot, bos + t0 + ot, t0 + ot < length


@triton.jit
def _wy64_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, coff_ptr, G_ptr, a_ptr, w_ptr, u_ptr, N,
                 HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 LOG_N: tl.constexpr, PREC: tl.constexpr, RELOAD_K: tl.constexpr = True,
                 DIAG_X4: tl.constexpr = True, KC: tl.constexpr = 64,
                 VC: tl.constexpr = 64):
    """One program per (chunk, value head). a_ptr: fp32 scratch [max_chunks, HV, BT, BT].
    DIAG_X4: the four diagonal blocks solved as one [4, 16, 16] tile (else one by one).
    KC / VC: W / U column pieces (powers of two dividing K / V)."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    if c >= tl.load(coff_ptr + N):
        return
    bos, length, t0, ot, rows, m = _chunk_rows(coff_ptr, cu_ptr, c, N, LOG_N)
    hk = hv // (HV // HK)
    o = tl.arange(0, BC)
    ok = tl.arange(0, K)
    dt = k_ptr.dtype.element_ty

    G = tl.cumsum(tl.load(g_ptr + rows * HV + hv, mask=m, other=0.0), 0)
    tl.store(G_ptr + rows * HV + hv, G, mask=m)
    b = tl.load(beta_ptr + rows * HV + hv, mask=m, other=0.0).to(tl.float32)
    kp = k_ptr + rows[:, None] * (HK * K) + hk * K + ok[None, :]
    kk = tl.load(kp, mask=m[:, None], other=0.0)

    # 1. A (masked rows and columns are zero keys: zero rows / columns of A)
    low = ot[:, None] > ot[None, :]
    decay = tl.exp(tl.where(low, G[:, None] - G[None, :], 0.0))  # masked: no overflow above
    a = tl.where(low, _dot(kk, tl.trans(kk), IEEE=PREC) * decay, 0.0) * b[:, None]
    sp = a_ptr + (c.to(tl.int64) * HV + hv) * (BT * BT)
    tl.store(sp + ot[:, None] * BT + ot[None, :], a)
    tl.debug_barrier()

    # 2. T = (I + A)^-1, block lower triangular: T_ii = (I + A_ii)^-1,
    # T_ij = -T_ii sum_(j <= m < i) A_im T_mj; the upper blocks stay A's zeros.
    # The diagonal blocks are solved together as one [4, 16, 16] tile and go back to the
    # scratch (their A is no longer needed), to be read again as the merge's 2-D operands.
    ob = tl.arange(0, 4)
    diag = sp + (ob[:, None, None] * BC + o[None, :, None]) * BT + ob[:, None, None] * BC \
        + o[None, None, :]
    a10 = _blk(sp, 1, 0, o)
    a20 = _blk(sp, 2, 0, o)
    a21 = _blk(sp, 2, 1, o)
    a30 = _blk(sp, 3, 0, o)
    a31 = _blk(sp, 3, 1, o)
    a32 = _blk(sp, 3, 2, o)
    if DIAG_X4:
        td = _inv_unit_lower_x4(tl.load(diag, cache_modifier=".cg"), o)
        tl.debug_barrier()
        tl.store(diag, td)
        tl.debug_barrier()
        t00 = _blk(sp, 0, 0, o)
        t11 = _blk(sp, 1, 1, o)
        t22 = _blk(sp, 2, 2, o)
        t33 = _blk(sp, 3, 3, o)
    else:  # four chains in a row, as the fused kernel (fewer registers)
        t00 = _inv_unit_lower(_blk(sp, 0, 0, o), o)
        t11 = _inv_unit_lower(_blk(sp, 1, 1, o), o)
        t22 = _inv_unit_lower(_blk(sp, 2, 2, o), o)
        t33 = _inv_unit_lower(_blk(sp, 3, 3, o), o)
        tl.debug_barrier()
        _put(sp, 0, 0, o, t00)
        _put(sp, 1, 1, o, t11)
        _put(sp, 2, 2, o, t22)
        _put(sp, 3, 3, o, t33)
    t10 = -_mm(t11, _mm(a10, t00))
    t21 = -_mm(t22, _mm(a21, t11))
    t32 = -_mm(t33, _mm(a32, t22))
    t20 = -_mm(t22, _mm(a20, t00) + _mm(a21, t10))
    t31 = -_mm(t33, _mm(a31, t11) + _mm(a32, t21))
    t30 = -_mm(t33, _mm(a30, t00) + _mm(a31, t10) + _mm(a32, t20))
    # (the off-diagonal A blocks were read before the barrier above)
    _put(sp, 1, 0, o, t10)
    _put(sp, 2, 1, o, t21)
    _put(sp, 3, 2, o, t32)
    _put(sp, 2, 0, o, t20)
    _put(sp, 3, 1, o, t31)
    _put(sp, 3, 0, o, t30)
    tl.debug_barrier()

    # 3. W = T (beta e^G K), U = T (beta V): 64-row products in the activations' dtype, in
    # column pieces KC / VC wide (one piece's accumulator live at a time: 8 warps, 170 instead
    # of 203 registers at 64). RELOAD_K: the keys are read again (L2 hits) rather than held
    # live across the solve.
    t = tl.load(sp + ot[:, None] * BT + ot[None, :], cache_modifier=".cg").to(dt)
    kscale = (b * tl.exp(G))[:, None]
    if RELOAD_K or KC < K:
        for p in tl.static_range(K // KC):
            oc = p * KC + tl.arange(0, KC)
            kc = tl.load(k_ptr + rows[:, None] * (HK * K) + hk * K + oc[None, :], mask=m[:, None],
                         other=0.0, cache_modifier=".ca")
            tl.store(w_ptr + rows[:, None] * (HV * K) + hv * K + oc[None, :],
                     _dot(t, (kc * kscale).to(dt), IEEE=PREC).to(dt), mask=m[:, None])
    else:
        tl.store(w_ptr + rows[:, None] * (HV * K) + hv * K + ok[None, :],
                 _dot(t, (kk * kscale).to(dt), IEEE=PREC).to(dt), mask=m[:, None])
    for p in tl.static_range(V // VC):
        oc = p * VC + tl.arange(0, VC)
        vp = rows[:, None] * (HV * V) + hv * V + oc[None, :]
        vb = (tl.load(v_ptr + vp, mask=m[:, None], other=0.0) * b[:, None]).to(dt)
        tl.store(u_ptr + vp, _dot(t, vb, IEEE=PREC).to(dt), mask=m[:, None])
