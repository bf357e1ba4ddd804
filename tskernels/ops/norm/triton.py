"""Triton RMSNorm (+ fused residual add): one program normalises ROWS rows of length N.

Memory-bound: each row is read once and written once (plus the residual's read and write for
the fused form); the sum of squares is accumulated in fp32 within the program, so the launch
needs no second pass and no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning
from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared import pdl

FORMATS = {"x": ("fp32", "fp16", "bf16"), "weight": ("fp32", "fp16", "bf16")}
MAX_HIDDEN = 65536


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, n_rows, N, x_stride, res_stride,
                    y_stride, res_out_stride, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
                    ROWS: tl.constexpr):
    """y = (x [+ res]) * rsqrt(mean((x [+ res])^2) + eps) * w ; res_out = x + res."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    for i in tl.static_range(ROWS):
        row = (pid * ROWS + i).to(tl.int64)
        rmask = cmask & (row < n_rows)
        x = tl.load(x_ptr + row * x_stride + cols, mask=rmask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * res_stride + cols, mask=rmask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            tl.store(res_out_ptr + row * res_out_stride + cols, x, mask=rmask)
        xf = x.to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
        y = xf * inv * w
        tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _rmsnorm_chained_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, n_rows, N, x_stride,
                            res_stride, y_stride, res_out_stride, eps, HAS_RES: tl.constexpr,
                            BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    """_rmsnorm_kernel chained (shared/pdl.py): its dependent (the next projection's gemv) may
    launch at once and stream its weights while this waits for x and runs. PDL False (the
    interpreter, non-Hopper): the plain kernel. The tuned tables key on _rmsnorm_kernel's
    source, which this wrapper leaves as it is."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, n_rows, N, x_stride, res_stride,
                    y_stride, res_out_stride, eps, HAS_RES, BLOCK, ROWS)


# rows of at most 256 columns: several per program only while the grid keeps this many programs.
# H200 (benchmarks/results/h200/s24_heuristics.json, bf16, N = 64 / 128 / 256): 1024 rows
# fastest at 1 row per program (1.65-1.67 us; 8 rows: 5.0-5.7), 8192 rows at 4 (4.2-5.0; 8:
# 5.6-7.0), 262144 rows at 8 (44-74 us; 4: 80-82)
SHORT_ROW_MIN_PROGRAMS = 2048


def _launch_params(N: int, n_rows: int) -> tuple[int, int, int]:
    """The heuristic: one warp per 256 columns (up to 16), several short rows per program."""
    block = triton.next_power_of_2(N)
    num_warps = max(1, min(16, block // 256))
    # Small rows: several per program so each program still moves a few KB.
    rows = max(1, min(8, 2048 // block)) if n_rows >= 1024 else 1
    if block <= 256:
        while rows > 1 and n_rows // rows < SHORT_ROW_MIN_PROGRAMS:
            rows //= 2
    return block, num_warps, rows


def _prune(cfg: dict, p, target) -> str | None:
    block = triton.next_power_of_2(p["N"])
    if cfg["num_warps"] * target.warp_size > block:
        return "more threads than columns"
    if cfg["rows"] > 1 and block > 4096:
        return "several rows per program only for rows <= 4096 wide"
    return None


def _runner(p, device):
    N, n_rows, dt = p["N"], p["rows"], getattr(torch, p.get("dtype", "bfloat16"))
    make = lambda d: (torch.randn(n_rows, N, device=d, dtype=dt),  # noqa: E731
                      torch.rand(N, device=d, dtype=dt) + 0.5)
    ref = lambda x: (x[0].double() * torch.rsqrt(x[0].double().pow(2).mean(-1, keepdim=True)  # noqa: E731
                                                + 1e-6) * x[1].double())
    return tuning.TensorRunner(make, lambda cfg, x: _run(x[0], None, x[1], 1e-6, None, None, cfg),
                               ref, device)


SPACE = declare(KernelSpace(
    "norm.rmsnorm.triton", Space(num_warps=[1, 2, 4, 8, 16, 32], rows=[1, 2, 4, 8]),
    key=lambda p: {"N": pow2_bucket(p["N"]), "rows": tuning.rows_bucket(p["rows"]),
                   "dtype": p.get("dtype", "bfloat16")},
    heuristic=lambda p: dict(zip(("num_warps", "rows"), _launch_params(p["N"], p["rows"])[1:])),
    prune=_prune, source=lambda: jit_source(_rmsnorm_kernel), runner=_runner,
    parse=tuning.parse_shape, example={"N": 4096, "rows": 64, "dtype": "bfloat16"}))


def _run(x, residual, weight, eps, out, res_out, cfg: dict | None = None):
    N = x.shape[-1]
    if N > MAX_HIDDEN:
        raise ValueError(f"x: hidden size {N} exceeds the Triton kernel's limit {MAX_HIDDEN}")
    x2 = x.reshape(-1, N)
    y = out if out is not None else torch.empty_like(x)
    y2 = y.view(-1, N)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return y
    block = triton.next_power_of_2(N)
    if cfg is None:
        cfg = tuning.config(SPACE, {"N": N, "rows": n_rows,
                                    "dtype": tuning.dtype_name(x.dtype)}, x.device)
    num_warps, rows = cfg["num_warps"], cfg["rows"]
    has_res = residual is not None
    r2 = residual.reshape(-1, N) if has_res else x2
    ro2 = res_out.view(-1, N) if has_res else y2
    kernel, extra = _rmsnorm_kernel, {}
    if pdl.chained("rmsnorm"):
        kernel, extra = _rmsnorm_chained_kernel, pdl.launch_args(x.device)
    kernel[(triton.cdiv(n_rows, rows),)](
        x2, r2, weight, y2, ro2, n_rows, N, x2.stride(0), r2.stride(0), y2.stride(0),
        ro2.stride(0), eps, HAS_RES=has_res, BLOCK=block, ROWS=rows, num_warps=num_warps,
        **extra)
    return y


def _cases(has_res: bool):
    sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16",
           "res_out_ptr": "*bf16", "n_rows": "i32", "N": "i32", "x_stride": "i32",
           "res_stride": "i32", "y_stride": "i32", "res_out_stride": "i32", "eps": "fp32"}
    c = dict(HAS_RES=has_res, BLOCK=4096, ROWS=1)
    return [CompileCase(_rmsnorm_kernel, sig, c, num_warps=16,
                        label="residual" if has_res else ""),
            # chained (shared/pdl.CHAIN), as sm_90+ launches it
            CompileCase(_rmsnorm_chained_kernel, sig, dict(c, PDL=True), num_warps=16,
                        targets=pdl.TARGETS, label="residual" if has_res else "")]


@register("norm", "rmsnorm", **TRITON, formats=FORMATS,
          traits={"hidden": lambda n: n <= MAX_HIDDEN}, tags=("deterministic",),
          compile_cases=lambda: _cases(False))
def rmsnorm(x, weight, eps, out=None):
    """Triton RMSNorm, one pass, fp32 accumulation."""
    return _run(x, None, weight, eps, out, None)


@register("norm", "fused_add_rmsnorm", **TRITON, formats=FORMATS,
          traits={"hidden": lambda n: n <= MAX_HIDDEN}, tags=("deterministic",),
          compile_cases=lambda: _cases(True))
def fused_add_rmsnorm(x, residual, weight, eps):
    """Triton residual add + RMSNorm in one pass."""
    res_out = torch.empty_like(x)
    y = _run(x, residual, weight, eps, None, res_out)
    return y, res_out
