"""Decode gemvs with the op before them fused into their activation load (M <= 16):
`rmsnorm_gemv` (c = rmsnorm(x) @ w.T) and `silu_mul_gemv` (c = silu(gate) * up @ w.T), each
with the optional residual-add epilogue of `gemv`, and the plain gemv's early-stream variant.

The kernel is the split-K weight-streaming kernel of triton_gemv (same plan, workspace and
last-arrival reduction) with a prologue on the activation tile:
- RMSNorm: every program first takes its rows' sum of squares over the full K (x is <= 16
  rows of a hidden size: a few KB, read from L2), then scales its K slice on the fly by
  rstd * norm_weight and rounds to x's dtype before the dot, as norm.rmsnorm's output is
  rounded (its float32 math: x * rstd * weight, one rounding), so fused and unfused agree
  to the product's rounding.
- SiLU-mul: x is the gate|up product [M, 2K]; the program's K slice of silu(gate) * up is
  computed in float32 and rounded to x's dtype (activation.silu_and_mul's rounding).

Early streaming (EARLY): on sm_90+ the launch is a programmatic dependent launch; the
program lets its dependents launch at once (griddepcontrol.launch_dependents), issues its
first weight tile *before* griddepcontrol.wait and only then reads x / the residual / the
workspace (which the previous kernel may write). Weights and the norm weight are never
written by a kernel of the step, so the next projection's weight stream starts while the
previous kernel drains. The dependents' own wait covers everything this kernel writes.
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
# the fused ops' early stream (first weight tile before the PDL wait); a module switch so the
# lab script can time the prologue fusion with and without it
EARLY_FUSED = True
# elements of x per sum-of-squares tile (rows x columns; 32 float32 per thread at 4 warps)
_SS_TILE = tl.constexpr(4096)


@triton.jit
def _x_tile(x_rows, nw_ptr, rstd, offs_k, mask, K, PRO: tl.constexpr):
    """The activation tile [MP, BK] of the program's rows at offs_k, prologue applied and
    rounded to x's dtype (masked entries are 0: they meet zero weights or padding rows)."""
    if PRO == 2:
        g = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        u = tl.load(x_rows + K + offs_k[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        x = (g * tl.sigmoid(g) * u).to(x_rows.dtype.element_ty)
    else:
        x = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
        if PRO == 1:
            nw = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * rstd[:, None] * nw[None, :]).to(x_rows.dtype.element_ty)
    return x


@triton.jit
def _fused_stream_kernel(w_ptr, x_ptr, c_ptr, r_ptr, nw_ptr, ws_ptr, cnt_ptr,
                         M, N, K, stride_w, stride_x, stride_c, stride_r, K_SPLIT, eps,
                         BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                         MR: tl.constexpr, SPLIT: tl.constexpr, HAS_RES: tl.constexpr,
                         EVEN_K: tl.constexpr, PRO: tl.constexpr, EARLY: tl.constexpr,
                         PDL: tl.constexpr = False):
    """c[:M, n-tile] = pro(x)[:M] @ w[n-tile].T (+ r) over K range [pid_k * K_SPLIT, +K_SPLIT).

    w [N, K]; x [M, K] (PRO 0 / 1) or [M, 2K] gate|up (PRO 2), unit K stride; nw [K] the
    RMSNorm weight (PRO 1). MR: M rounded up to a power of two (the sum-of-squares tile).
    EARLY: the first weight tile is loaded before the PDL wait (and before anything of x).
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
    if EARLY:  # weights only: nothing the previous kernel writes
        offs_k0 = k0 + tl.arange(0, BK)
        if EVEN_K:
            w0 = tl.load(w_rows + offs_k0[None, :], mask=n_mask[:, None], other=0.0,
                         eviction_policy="evict_first")
        else:
            w0 = tl.load(w_rows + offs_k0[None, :], mask=n_mask[:, None] &
                         (offs_k0 < K)[None, :], other=0.0, eviction_policy="evict_first")
    if PDL:
        gdc_wait()
    rstd = tl.zeros((MP,), dtype=tl.float32)
    if PRO == 1:
        RBK: tl.constexpr = _SS_TILE // MR
        rows_r = tl.arange(0, MR)
        xr_rows = x_ptr + rows_r[:, None] * stride_x
        ss = tl.zeros((MR,), dtype=tl.float32)
        for kk in tl.range(0, K, RBK, loop_unroll_factor=4):
            offs_r = kk + tl.arange(0, RBK)
            xv = tl.load(xr_rows + offs_r[None, :], mask=(rows_r < M)[:, None] &
                         (offs_r < K)[None, :], other=0.0, eviction_policy="evict_last")
            xv = xv.to(tl.float32)
            ss += tl.sum(xv * xv, axis=1)
        rs = tl.rsqrt(ss / K + eps)
        # the MR rows' rstd onto the MP-row layout of the activation tile
        rstd = tl.sum(tl.where(offs_m[:, None] == rows_r[None, :], rs[None, :], 0.0), axis=1)
    acc = tl.zeros((BN, MP), dtype=tl.float32)
    kstart = k0
    if EARLY:
        xm0 = m_mask[:, None] if EVEN_K else m_mask[:, None] & (offs_k0 < K)[None, :]
        x0 = _x_tile(x_rows, nw_ptr, rstd, offs_k0, xm0, K, PRO)
        acc = tl.dot(w0, tl.trans(x0), acc)
        kstart = k0 + BK
    for k in range(kstart, k1, BK):
        offs_k = k + tl.arange(0, BK)
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0,
                        eviction_policy="evict_first")
            x = _x_tile(x_rows, nw_ptr, rstd, offs_k, m_mask[:, None], K, PRO)
        else:
            k_mask = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0, eviction_policy="evict_first")
            x = _x_tile(x_rows, nw_ptr, rstd, offs_k, m_mask[:, None] & k_mask[None, :], K,
                        PRO)
        acc = tl.dot(w, tl.trans(x), acc)
    mask2 = n_mask[:, None] & m_mask[None, :]
    if SPLIT:
        _split_reduce(acc, c_ptr, r_ptr, ws_ptr, cnt_ptr, pid_n, offs_m, offs_n, mask2, N,
                      stride_c, stride_r, BN, MP, HAS_RES)
    else:
        tg._epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, HAS_RES)


@triton.jit
def _split_reduce(acc, c_ptr, r_ptr, ws_ptr, cnt_ptr, pid_n, offs_m, offs_n, mask2, N,
                  stride_c, stride_r, BN: tl.constexpr, MP: tl.constexpr,
                  HAS_RES: tl.constexpr):
    """triton_gemv's split-K meeting (kept textually apart from its kernel, whose source
    hash keys the tuned tables): fp32 atomics into the workspace, the tile's last arrival
    takes the sum with an exchange against zero, resets the counter and writes c."""
    tile = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
    tl.atomic_add(tile, acc, mask=mask2, sem="relaxed")
    tl.debug_barrier()  # every thread's adds happen-before the counter's acq_rel release
    arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
    if arrived == tl.num_programs(1) - 1:
        bits = ws_ptr.to(tl.pointer_type(tl.int32)) + offs_m[None, :] * N + offs_n[:, None]
        acc = tl.atomic_xchg(bits, tl.zeros((BN, MP), dtype=tl.int32), mask=mask2,
                             sem="relaxed").to(tl.float32, bitcast=True)
        tl.atomic_xchg(cnt_ptr + pid_n, 0)
        tg._epilogue(acc, c_ptr, r_ptr, offs_m, offs_n, mask2, stride_c, stride_r, HAS_RES)


def _mr(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def fused_stream_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, prologue: int,
                    norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                    residual: torch.Tensor | None = None, early: bool | None = None,
                    config: dict | None = None) -> torch.Tensor:
    """out[:M] = pro(x) @ w.T (+ residual), M <= 16, 16-bit x / w. K = w.shape[1]; x [M, K]
    (or [M, 2K] for PRO_SILU_MUL) with unit K stride; out / residual [M, N], unit N stride.
    early: the first weight tile ahead of the rest (default: EARLY_FUSED on PDL launches,
    where it goes before the wait; elsewhere it only reorders the loop)."""
    m = x.shape[0]
    n, k = w.shape
    cfg, split, k_split = tg.plan(m, n, k, False, x.device, config)
    ws, cnt = tg._workspace(x.device) if split > 1 else (out, out)
    r = residual if residual is not None else out
    nw = norm_weight if norm_weight is not None else out
    pdl = tg._pdl(x.device)
    grid = (triton.cdiv(n, cfg["BN"]), split)
    _fused_stream_kernel[grid](
        w, x, out, r, nw, ws, cnt, m, n, k, w.stride(0), x.stride(0), out.stride(0),
        r.stride(0), k_split, float(eps),
        BN=cfg["BN"], BK=cfg["BK"], MP=tg.mpad(m), MR=_mr(m), SPLIT=split > 1,
        HAS_RES=residual is not None, EVEN_K=k % cfg["BK"] == 0, PRO=prologue,
        EARLY=(EARLY_FUSED and pdl) if early is None else early, PDL=pdl,
        num_stages=cfg["num_stages"], num_warps=cfg["num_warps"],
        **backend_options(cfg), **({"launch_pdl": True} if pdl else {}))
    return out


def compile_cases(prologues: tuple[int, ...]) -> list[CompileCase]:
    """The prologues' kernel as launched on sm_90+ (PDL, early stream, split, residual), plus
    the plain launch other NVIDIA targets get."""
    sig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "c_ptr": "*bf16", "r_ptr": "*bf16",
           "nw_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "stride_w": "i32", "stride_x": "i32", "stride_c": "i32",
           "stride_r": "i32", "K_SPLIT": "i32", "eps": "fp32"}
    aligned = ("N", "K", "stride_w", "stride_x", "stride_c", "stride_r", "K_SPLIT")
    cfg = tg.STREAM_CONFIGS[("16bit", 16)]
    cases = []
    for pro, name, res in ((PRO_RMSNORM, "rmsnorm", False), (PRO_SILU_MUL, "silu_mul", True),
                           (PRO_NONE, "plain", True)):
        if pro not in prologues:
            continue
        for mr, pdl in ((1, True), (16, True), (1, False)):
            if pro != PRO_RMSNORM and mr != 1:
                continue  # MR only shapes the RMSNorm tile
            cases.append(CompileCase(
                _fused_stream_kernel, sig,
                dict(BN=cfg["BN"], BK=cfg["BK"], MP=16, MR=mr, SPLIT=True, HAS_RES=res,
                     EVEN_K=True, PRO=pro, EARLY=pdl, PDL=pdl),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], uses_dot=True,
                aligned=aligned, targets=tg._PDL_TARGETS if pdl else tg._NVIDIA_TARGETS,
                label=f"{name} M<={mr if pro == PRO_RMSNORM else 16} split"
                      f"{' +res' if res else ''}{' pdl early' if pdl else ''}"))
    # CDNA: the plain launch at triton_gemv's per-arch streaming configs (heuristic, not run)
    cases += [dataclasses.replace(
        c, constexprs=dict(c.constexprs, BN=acfg["BN"], BK=acfg["BK"]),
        num_warps=acfg["num_warps"], num_stages=acfg["num_stages"], targets=(arch,),
        options=tuple(backend_options(acfg).items()), label=f"{c.label} {arch}")
        for arch, acfg in tg.CDNA_STREAM_CONFIGS.items() for c in list(cases)
        if not c.constexprs["PDL"]]
    return cases


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
