"""Decode gemvs with the op before them fused into their activation load (M <= 16):
`rmsnorm_gemv` (c = rmsnorm(x) @ w.T) and `silu_mul_gemv` (c = silu(gate) * up @ w.T), each
with the optional residual-add epilogue of `gemv`, and the plain gemv's early-stream variant.

The kernel streams weights as triton_gemv's split-K kernel does (same plan: tiles, stages,
warps, K splits; same workspace and last-arrival reduction) with a prologue on the
activation tile, applied in registers tile by tile (no extra pass over x):
- RMSNorm: rstd is a per-row scalar, so rmsnorm(x) @ w.T = rstd * ((x * weight) @ w.T). The
  loop takes x * weight (float32, rounded to x's dtype) as the operand and gathers the rows'
  sums of squares of its K slice beside the dot; the split reduction adds those sums too and
  the epilogue scales each row by rsqrt(sum / K + eps) before the residual and the store.
  The rounding differs from the unfused pair (which rounds x * rstd * weight): both round
  the operand once, so they agree within the dtype's tolerance, not bitwise. In fp16 the
  un-normalized x * weight must stay within fp16's range (serve fuses bf16 only).
- SiLU-mul: x is the gate|up product [M, 2K]; the tile's silu(gate) * up is computed in
  float32 (approximate ex2 and reciprocal) and rounded to x's dtype, as
  activation.silu_and_mul.

Orientation: the product is c [MP, BN] = x_tile [MP, BK] @ w_tile.T, so the (<= 16) activation
rows are the MMA's M side and a register operand (mma.sync). The plain gemv's orientation
(weights as wgmma's M side, x from shared memory) would make the prologue's tile go through a
register -> shared store each iteration, which Triton's pipeliner cannot multi-buffer: the
wgmma turns synchronous (wait 0) and the next weight tiles are issued only after it, which
made the fused launches slower than the plain gemv alone on the H200 (with the former
full-row sum-of-squares pass of every program: up to 2.8 x at M = 16). Here the loop's
loads stay cp.async three tiles ahead and the prologue math overlaps them.

Early streaming (EARLY): on sm_90+ the launch is a programmatic dependent launch; the
program lets its dependents launch at once (griddepcontrol.launch_dependents), issues its
first weight tile *before* griddepcontrol.wait and only then reads x / the residual / the
workspace (which the previous kernel may write). Weights and the norm weight are never
written by a kernel of the step, so the next projection's weight stream starts while the
previous kernel drains. The dependents' own wait covers everything this kernel writes.
Off by default (EARLY_FUSED): the H200 showed it slower over a layer chain.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from autotune import backend_options

from ...compile import CompileCase
from . import triton_gemv as tg

PRO_NONE, PRO_RMSNORM, PRO_SILU_MUL = 0, 1, 2
# the first weight tile before the PDL wait (EARLY): off by default — on the H200 it cost
# 6.8 us over a Llama layer chain; kept as an option the lab script times
EARLY_FUSED = False
# M = 1 takes the CUDA-core persistent rows form (_fused_rows_kernel), as triton_gemv's plain
# gemv does; with triton_gemv.ROWS_M1 None both go back to the tensor-core streaming kernel.
# Not yet run on a GPU: tested under the interpreter and in the compile matrix (session 25,
# after the device time was spent); the fused decode path that calls it
# (serve.models.bound_ops.FUSE_DECODE_GEMV) stays off until its GPU tier and a serving A/B.
ROWS_M1 = True


@triton.jit
def _silu_mul_asm(g, u):
    """silu(g) * u = g * u / (1 + 2^(-g log2 e)) in float32 with the SFU's approximate ex2 and
    reciprocal (~2 ulp of fp32, far below the 16-bit rounding that follows). Not pure on
    purpose: Triton then evaluates it once per element in the loaded tile's layout and moves
    only the 16-bit result into the MMA operand layout; pure math is re-evaluated in that
    layout, where every warp holds the whole [MP, BK] tile (4 x the SFU work, which on the
    H200's SFU rate would cost more than a weight tile's streaming time)."""
    return tl.inline_asm_elementwise(
        "{ .reg .f32 t; mul.ftz.f32 t, $1, 0fBFB8AA3B; ex2.approx.ftz.f32 t, t; "
        "add.ftz.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 t, t; mul.ftz.f32 $0, $1, $2; "
        "mul.ftz.f32 $0, $0, t; }",
        "=r,r,r", [g, u], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _step(acc, sq, w, x_rows, nw_rows, offs_k, mask, K, PRO: tl.constexpr,
          ASM: tl.constexpr):
    """One K tile: acc [MP, BN] += pro(x)[:, offs_k] @ w.T with the activation prologue in
    registers (masked entries are 0: they meet zero weights or padding rows). sq [MP, BK]
    gathers x**2 (float32) for the RMSNorm row sums; nw_rows [MP, 1]: the norm weight's
    pointer repeated per row."""
    if PRO == 2:
        g = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        u = tl.load(x_rows + K + offs_k[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        if ASM:
            x = _silu_mul_asm(g, u).to(x_rows.dtype.element_ty)
        else:
            e = tl.exp2(g * -1.4426950408889634)
            x = tl.fdiv(g * u, 1.0 + e, ieee_rounding=False).to(x_rows.dtype.element_ty)
    elif PRO == 1:
        xf = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
        sq += xf * xf
        # the weight broadcast over the tile's rows: a [BK] load is 2 B a thread, too narrow
        # for cp.async, and would be a synchronous L2 round trip in every iteration; the
        # [MP, BK] one is pipelined with the tiles (x's mask: only the M real rows fetch)
        nw = tl.load(nw_rows + offs_k[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
        x = (xf * nw).to(x_rows.dtype.element_ty)
    else:
        x = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
    # x is the MMA's M side (<= 16 rows): a register operand of mma.sync, so the prologue's
    # tile never feeds an asynchronous (wgmma) operand and the weight tiles keep their
    # cp.async pipeline
    return tl.dot(x, tl.trans(w), acc), sq


@triton.jit
def _fused_stream_kernel(w_ptr, x_ptr, c_ptr, r_ptr, nw_ptr, ws_ptr, cnt_ptr, ss_ptr,
                         M, N, K, stride_w, stride_x, stride_c, stride_r, K_SPLIT, eps,
                         BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                         SPLIT: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr,
                         PRO: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr = False,
                         ASM: tl.constexpr = False):
    """c[:M, n-tile] = pro(x)[:M] @ w[n-tile].T (+ r) over K range [pid_k * K_SPLIT, +K_SPLIT).

    w [N, K]; x [M, K] (PRO 0 / 1) or [M, 2K] gate|up (PRO 2), unit K stride; nw [K] the
    RMSNorm weight (PRO 1). RMSNorm: the loop takes (x * nw) @ w.T and the rows' partial sums
    of squares; rstd = rsqrt(sum / K + eps) scales the reduced rows in the epilogue (split:
    the sums meet in ss [tiles, MP] beside the workspace). EARLY: the first weight tile is
    loaded before the PDL wait (and before anything of x). ASM: CUDA's inline SiLU
    (_silu_mul_asm; the interpreter and AMD take the tl math).
    """
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, MP)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(K, k0 + K_SPLIT)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + offs_m[:, None] * stride_x
    nw_rows = nw_ptr + tl.zeros_like(offs_m)[:, None]
    acc = tl.zeros((MP, BN), dtype=tl.float32)
    sq = tl.zeros((MP, BK), dtype=tl.float32)
    kstart = k0
    if EARLY:  # weights only: nothing the previous kernel writes
        offs_k0 = k0 + tl.arange(0, BK)
        if EVEN_K:
            w0 = tl.load(w_rows + offs_k0[None, :], mask=n_mask[:, None], other=0.0,
                         eviction_policy="evict_first")
            xm0 = m_mask[:, None]
        else:
            w0 = tl.load(w_rows + offs_k0[None, :], mask=n_mask[:, None] &
                         (offs_k0 < K)[None, :], other=0.0, eviction_policy="evict_first")
            xm0 = m_mask[:, None] & (offs_k0 < K)[None, :]
        if PDL:
            gdc_wait()
        acc, sq = _step(acc, sq, w0, x_rows, nw_rows, offs_k0, xm0, K, PRO, ASM)
        kstart = k0 + BK
    elif PDL:
        gdc_wait()
    for k in range(kstart, k1, BK):
        offs_k = k + tl.arange(0, BK)
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0,
                        eviction_policy="evict_first")
            acc, sq = _step(acc, sq, w, x_rows, nw_rows, offs_k, m_mask[:, None], K, PRO, ASM)
        else:
            k_mask = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0, eviction_policy="evict_first")
            acc, sq = _step(acc, sq, w, x_rows, nw_rows, offs_k,
                            m_mask[:, None] & k_mask[None, :], K, PRO, ASM)
    ss = tl.sum(sq, axis=1)
    mask2 = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        # the split-K meeting of triton_gemv (kept textually apart from its kernel, whose
        # source hash keys the tuned tables), in [MP, BN] order and with the row sums
        tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.atomic_add(tile, acc, mask=mask2, sem="relaxed")
        # the row sums as column 0 of an [MP, BN] tile: 2-D like acc, so no element of the
        # atomics is held by two threads (a 1-D [MP] tensor is replicated over the CTA)
        col0 = (tl.arange(0, BN) == 0)[None, :]
        ss_at = pid_n * MP + offs_m[:, None] + tl.zeros((1, BN), dtype=tl.int32)
        ss_mask = m_mask[:, None] & col0
        if PRO == 1:
            tl.atomic_add(ss_ptr + ss_at, tl.where(col0, ss[:, None], 0.0), mask=ss_mask,
                          sem="relaxed")
        tl.debug_barrier()  # every thread's adds happen-before the counter's acq_rel release
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) - 1:
            # read and re-zero in one L2 atomic (int32 view: the interpreter exchanges ints)
            bits = ws_ptr.to(tl.pointer_type(tl.int32)) + offs_m[:, None] * N + offs_n[None, :]
            acc = tl.atomic_xchg(bits, tl.zeros((MP, BN), dtype=tl.int32), mask=mask2,
                                 sem="relaxed").to(tl.float32, bitcast=True)
            if PRO == 1:
                sbits = ss_ptr.to(tl.pointer_type(tl.int32)) + ss_at
                got = tl.atomic_xchg(sbits, tl.zeros((MP, BN), dtype=tl.int32), mask=ss_mask,
                                     sem="relaxed").to(tl.float32, bitcast=True)
                ss = tl.sum(tl.where(ss_mask, got, 0.0), axis=1)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            _epilogue(acc, ss, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, K,
                      eps, HAS_RES, PRO)
    else:
        _epilogue(acc, ss, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, K, eps,
                  HAS_RES, PRO)


@triton.jit
def _epilogue(acc, ss, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, K, eps,
              HAS_RES: tl.constexpr, PRO: tl.constexpr):
    """acc [MP, BN] (the full K sum): RMSNorm's rstd per row, the residual, the store."""
    if PRO == 1:
        acc = acc * tl.rsqrt(ss / K + eps)[:, None]
    if HAS_RES:
        r = tl.load(r_ptr + offs_m[:, None] * stride_r + offs_n[None, :], mask=mask2, other=0.0)
        acc += r.to(tl.float32)
    tl.store(c_ptr + offs_m[:, None] * stride_c + offs_n[None, :],
             acc.to(c_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def _rows_x(x_ptr, nw_ptr, k0, cols, K, PRO: tl.constexpr, EVEN_K: tl.constexpr,
            ASM: tl.constexpr):
    """One [BK] slice of pro(x) for the rows kernel (fp32, rounded to x's dtype first as the
    tensor-core form rounds its operand): x (PRO 0), x * nw (PRO 1: rstd is applied to the
    reduced rows, as there), silu(gate) * up (PRO 2, x = gate | up)."""
    offs = k0 + cols
    m = offs < K
    if PRO == 2:
        if EVEN_K:
            g = tl.load(x_ptr + offs, eviction_policy="evict_last").to(tl.float32)
            u = tl.load(x_ptr + K + offs, eviction_policy="evict_last").to(tl.float32)
        else:
            g = tl.load(x_ptr + offs, mask=m, other=0.0, eviction_policy="evict_last").to(
                tl.float32)
            u = tl.load(x_ptr + K + offs, mask=m, other=0.0, eviction_policy="evict_last").to(
                tl.float32)
        if ASM:
            x = _silu_mul_asm(g, u)
        else:
            x = tl.fdiv(g * u, 1.0 + tl.exp2(g * -1.4426950408889634), ieee_rounding=False)
    else:
        if EVEN_K:
            x = tl.load(x_ptr + offs, eviction_policy="evict_last").to(tl.float32)
        else:
            x = tl.load(x_ptr + offs, mask=m, other=0.0, eviction_policy="evict_last").to(
                tl.float32)
        if PRO == 1:
            if EVEN_K:
                nw = tl.load(nw_ptr + offs, eviction_policy="evict_last").to(tl.float32)
            else:
                nw = tl.load(nw_ptr + offs, mask=m, other=0.0,
                             eviction_policy="evict_last").to(tl.float32)
            x = x * nw
    return x.to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _fused_rows_kernel(w_ptr, x_ptr, c_ptr, r_ptr, nw_ptr, N, K, stride_w, NB, P, eps,
                       KT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       HAS_RES: tl.constexpr, EVEN_K: tl.constexpr, PRO: tl.constexpr,
                       PDL: tl.constexpr = False, ASM: tl.constexpr = False):
    """M = 1: c = pro(x) @ w.T (+ r) on the CUDA cores, the persistent rows form of
    triton_gemv._rows_persist_kernel (P programs, row blocks pid, pid + P, ..., next tile's
    load ahead of the current tile's FMAs, first weight tile before the PDL wait) with the
    prologue applied to each x slice. RMSNorm: every program first sums x**2 over the whole
    row (K values, from L2) for rstd, and scales its reduced rows by it."""
    pid = tl.program_id(0)
    total = ((NB - pid + P - 1) // P) * KT
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BK)
    w_cur = tg.persist_first_tile(w_ptr, N, K, stride_w, pid, rows, cols, EVEN_K, PDL)
    rstd = 1.0
    if PRO == 1:
        sq = tl.zeros((BK,), dtype=tl.float32)
        for t in range(KT):
            if EVEN_K:
                xs = tl.load(x_ptr + t * BK + cols, eviction_policy="evict_last")
            else:
                xs = tl.load(x_ptr + t * BK + cols, mask=(t * BK + cols) < K, other=0.0,
                             eviction_policy="evict_last")
            xs = xs.to(tl.float32)
            sq += xs * xs
        rstd = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for it in range(1, total + 1):
        k_cur = ((it - 1) % KT) * BK
        w_nxt = tg.persist_next_tile(w_ptr, N, K, stride_w, pid, P, it, total, rows, cols, KT,
                                     BK, EVEN_K)
        x = _rows_x(x_ptr, nw_ptr, k_cur, cols, K, PRO, EVEN_K, ASM)
        acc += w_cur.to(tl.float32) * x[None, :]
        if it % KT == 0:  # the block's last tile: reduce, scale, store, next block
            n_cur = (pid + ((it - 1) // KT) * P) * BN + rows
            c = tl.sum(acc, axis=1)
            if PRO == 1:
                c = c * rstd
            if HAS_RES:
                c += tl.load(r_ptr + n_cur, mask=n_cur < N, other=0.0).to(tl.float32)
            tl.store(c_ptr + n_cur, c.to(c_ptr.dtype.element_ty), mask=n_cur < N)
            acc = tl.zeros((BN, BK), dtype=tl.float32)
        w_cur = w_nxt


def fused_rows_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, prologue: int,
                  norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """out[0] = pro(x[0]) @ w.T (+ residual) through _fused_rows_kernel: x [1, K] (or [1, 2K]
    gate | up for PRO_SILU_MUL) and w [N, K] 16-bit with unit K stride; out / residual [1, N].
    The persistent rows launch (tiles and grid) of triton_gemv.persist_config / rows_mm."""
    n, k = w.shape
    cfg = tg.persist_config(k)
    bn, bk = cfg["BN"], cfg["BK"]
    nb, kt = triton.cdiv(n, bn), triton.cdiv(k, bk)
    pdl = tg._pdl(x.device)
    r = residual if residual is not None else out
    nw = norm_weight if norm_weight is not None else out
    args = (w, x, out, r, nw, n, k, w.stride(0), nb)
    meta = dict(KT=kt, BN=bn, BK=bk, HAS_RES=residual is not None, EVEN_K=k % bk == 0,
                PRO=prologue, PDL=pdl, ASM=x.device.type == "cuda" and torch.version.hip is None,
                num_warps=cfg["num_warps"], num_stages=1)
    p = tg.persist_grid(_fused_rows_kernel, x.device, args, (float(eps),), nb, meta)
    _fused_rows_kernel[(p,)](*args, p, float(eps), **meta,
                             **({"launch_pdl": True} if pdl else {}))
    return out


_ss_ws: dict[torch.device, torch.Tensor] = {}


def _ss_workspace(device: torch.device) -> torch.Tensor:
    """fp32 [CNT_ELEMS * 16]: the split RMSNorm launches' per-tile row sums of squares,
    zeroed once (the last arrival at a tile re-zeroes its slots); allocated on first use."""
    ss = _ss_ws.get(device)
    if ss is None:
        ss = _ss_ws[device] = torch.zeros(tg.CNT_ELEMS * 16, dtype=torch.float32,
                                          device=device)
    return ss


def fused_stream_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, prologue: int,
                    norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                    residual: torch.Tensor | None = None, early: bool | None = None,
                    config: dict | None = None) -> torch.Tensor:
    """out[:M] = pro(x) @ w.T (+ residual), M <= 16, 16-bit x / w. K = w.shape[1]; x [M, K]
    (or [M, 2K] for PRO_SILU_MUL) with unit K stride; out / residual [M, N], unit N stride.
    The launch plan (tiles, stages, warps, K splits) is triton_gemv's for the shape. early:
    the first weight tile ahead of the rest (default EARLY_FUSED, on PDL launches only)."""
    m = x.shape[0]
    n, k = w.shape
    if m > 16:
        raise ValueError(f"x: the fused gemv takes at most 16 rows, got {m}")
    if m == 1 and ROWS_M1 and config is None and early is None and tg.ROWS_M1 is not None \
            and tg._tune.cdna_arch(x.device) is None:
        return fused_rows_mm(x, w, out, prologue=prologue, norm_weight=norm_weight, eps=eps,
                             residual=residual)
    cfg, split, k_split = tg.plan(m, n, k, False, x.device, config)
    ws, cnt = tg._workspace(x.device) if split > 1 else (out, out)
    ss = _ss_workspace(x.device) if split > 1 and prologue == PRO_RMSNORM else out
    r = residual if residual is not None else out
    nw = norm_weight if norm_weight is not None else out
    pdl = tg._pdl(x.device)
    grid = (triton.cdiv(n, cfg["BN"]), split)
    _fused_stream_kernel[grid](
        w, x, out, r, nw, ws, cnt, ss, m, n, k, w.stride(0), x.stride(0), out.stride(0),
        r.stride(0), k_split, float(eps),
        BN=cfg["BN"], BK=cfg["BK"], MP=tg.mpad(m), SPLIT=split > 1,
        HAS_RES=residual is not None, EVEN_K=k % cfg["BK"] == 0, PRO=prologue,
        EARLY=(EARLY_FUSED and pdl) if early is None else early, PDL=pdl,
        ASM=x.device.type == "cuda" and torch.version.hip is None,
        num_stages=cfg["num_stages"], num_warps=cfg["num_warps"],
        **backend_options(cfg), **({"launch_pdl": True} if pdl else {}))
    return out


def compile_cases(prologues: tuple[int, ...]) -> list[CompileCase]:
    """The prologues' kernel as launched on sm_90+ (PDL, split, residual; the early-stream
    option too), plus the plain launch other NVIDIA targets get. The dot's M side is the
    <= 16 activation rows: mma.sync (narrow_dot), not wgmma, on sm_90 / sm_100 too."""
    sig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "c_ptr": "*bf16", "r_ptr": "*bf16",
           "nw_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "ss_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_w": "i32", "stride_x": "i32",
           "stride_c": "i32", "stride_r": "i32", "K_SPLIT": "i32", "eps": "fp32"}
    aligned = ("N", "K", "stride_w", "stride_x", "stride_c", "stride_r", "K_SPLIT")
    cfg = tg.STREAM_CONFIGS[("16bit", 16)]
    cases = []
    for pro, name, res in ((PRO_RMSNORM, "rmsnorm", False), (PRO_SILU_MUL, "silu_mul", True),
                           (PRO_NONE, "plain", True)):
        if pro not in prologues:
            continue
        for pdl, early in ((True, False), (True, True), (False, False)):
            cases.append(CompileCase(
                _fused_stream_kernel, sig,
                dict(BN=cfg["BN"], BK=cfg["BK"], MP=16, SPLIT=True, HAS_RES=res,
                     EVEN_K=True, PRO=pro, EARLY=early, PDL=pdl, ASM=True),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], uses_dot=True,
                narrow_dot=True, aligned=aligned,
                targets=tg._PDL_TARGETS if pdl else tg._NVIDIA_TARGETS,
                label=f"{name} M<=16 split{' +res' if res else ''}{' pdl' if pdl else ''}"
                      f"{' early' if early else ''}"))
    # M = 1: the CUDA-core persistent rows form (NVIDIA), as a 4096 x 4096 weight launches it
    rsig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "c_ptr": "*bf16", "r_ptr": "*bf16",
            "nw_ptr": "*bf16", "N": "i32", "K": "i32", "stride_w": "i32", "NB": "i32",
            "P": "i32", "eps": "fp32"}
    rcfg = tg.persist_config(4096)
    rows = []
    for pro, name, res in ((PRO_RMSNORM, "rmsnorm", False), (PRO_SILU_MUL, "silu_mul", True)):
        if pro not in prologues:
            continue
        for pdl in (True, False):
            rows.append(CompileCase(
                _fused_rows_kernel, rsig,
                dict(KT=4096 // rcfg["BK"], BN=rcfg["BN"], BK=rcfg["BK"], HAS_RES=res,
                     EVEN_K=True, PRO=pro, PDL=pdl, ASM=True),
                num_warps=rcfg["num_warps"], num_stages=1, aligned=("K", "stride_w"),
                targets=tg._PDL_TARGETS if pdl else tg._NVIDIA_TARGETS,
                label=f"{name} M=1 rows{' +res' if res else ''}{' pdl' if pdl else ''}"))
    # CDNA: the plain launch at triton_gemv's per-arch streaming configs (heuristic, not run)
    cases += [dataclasses.replace(
        c, constexprs=dict(c.constexprs, BN=acfg["BN"], BK=acfg["BK"], ASM=False),
        num_warps=acfg["num_warps"], num_stages=acfg["num_stages"], targets=(arch,),
        options=tuple(backend_options(acfg).items()), label=f"{c.label} {arch}")
        for arch, acfg in tg.CDNA_STREAM_CONFIGS.items() for c in list(cases)
        if not c.constexprs["PDL"]]
    return cases + rows


# ---- registration ----------------------------------------------------------------------------
def _out(x: torch.Tensor, n: int, out_dtype) -> torch.Tensor:
    return torch.empty(x.shape[0], n, dtype=out_dtype or x.dtype, device=x.device)


def _rmsnorm_gemv(x, norm_weight, b, *, eps, out_dtype=None, residual=None):
    """Triton rmsnorm(x) @ b.T (+ residual) for M <= 16 (RMSNorm prologue, split-K)."""
    out = _out(x, b.shape[0], out_dtype)
    if x.shape[0] == 0 or b.shape[0] == 0:
        return out
    return fused_stream_mm(tg._k_major(x), tg._k_major(b), out, prologue=PRO_RMSNORM,
                           norm_weight=norm_weight.contiguous(), eps=eps, residual=residual)


def _silu_mul_gemv(x, b, *, out_dtype=None, residual=None):
    """Triton (silu(gate) * up) @ b.T (+ residual) for M <= 16 (SiLU-mul prologue)."""
    out = _out(x, b.shape[0], out_dtype)
    if x.shape[0] == 0 or b.shape[0] == 0:
        return out
    return fused_stream_mm(tg._k_major(x), tg._k_major(b), out, prologue=PRO_SILU_MUL,
                           residual=residual)


def _register() -> None:
    from ...registry import register
    from .._common import TRITON

    fmts = {"x": ("fp16", "bf16"), "b": ("fp16", "bf16"), "c": ("fp16", "bf16", "fp32")}
    kw = dict(**{**TRITON, "band": "performant"}, traits={"residual": (False, True)})
    register("gemm", "rmsnorm_gemv", formats=fmts, **kw,
             compile_cases=lambda: compile_cases((PRO_RMSNORM,)))(_rmsnorm_gemv)
    # the plain early-stream launch (triton_gemv.EARLY_STREAM) is this kernel too
    register("gemm", "silu_mul_gemv", formats=fmts, **kw,
             compile_cases=lambda: compile_cases((PRO_SILU_MUL, PRO_NONE)))(_silu_mul_gemv)


_register()
