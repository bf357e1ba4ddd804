"""Triton fp8 (e4m3) quantizers: per-token-group (optionally fused with SiLU-and-mul),
per-row (per-channel / per-token) and per-tensor (dynamic or static scale).

Every scale is max(|x|, eps) / 448 over its group, computed in fp32, and q = x / scale
clamped to +-448 and rounded to nearest e4m3. Divisions are IEEE round-to-nearest
(div_rn, not the approximate fp32 division), so q and the scales match the reference value
for value; the fused SiLU uses the hardware exp, so its q may differ by one e4m3 step where
silu(g) * u sits on a rounding boundary.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase

FP8_MAX = 448.0


def _q_buffer(shape, device) -> torch.Tensor:
    """Where the kernel stores q. Under the interpreter (CPU tensors) its fp32 -> e4m3 cast
    rounds values just below a power of two down an exponent (124.3 -> 64), so there the
    kernel stores the clamped fp32 quotient and `_finish` rounds it with torch (RNE, like the
    GPU's cvt.rn.satfinite); on GPUs the kernel writes e4m3 itself."""
    dtype = torch.float32 if device.type == "cpu" else torch.float8_e4m3fn
    return torch.empty(shape, dtype=dtype, device=device)


def _finish(q: torch.Tensor) -> torch.Tensor:
    return q if q.dtype == torch.float8_e4m3fn else q.to(torch.float8_e4m3fn)


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_x, stride_q, stride_s, eps,
                        GROUP: tl.constexpr, ROWS: tl.constexpr, SILU_MUL: tl.constexpr):
    """One program: ROWS rows x one group of GROUP columns. SILU_MUL: x is [M, 2K] and the
    quantized value is silu(x[:, c]) * x[:, K + c]."""
    pid_r = tl.program_id(0)
    g = tl.program_id(1)
    rows = pid_r * ROWS + tl.arange(0, ROWS)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    y = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    if SILU_MUL:
        up = tl.load(base + K, mask=mask, other=0.0).to(tl.float32)
        y = y / (1.0 + tl.exp(-y)) * up
    amax = tl.max(tl.abs(y), axis=1)
    scale = tl.math.div_rn(tl.maximum(amax, eps), 448.0)
    q = tl.clamp(tl.math.div_rn(y, scale[:, None]), -448.0, 448.0)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_q + cols[None, :],
             q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + rows * stride_s + g, scale, mask=rows < M)


@triton.jit
def _row_quant_kernel(x_ptr, q_ptr, s_ptr, amax_ptr, M, K, stride_x, stride_q, eps,
                      BK: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: per-row scale (two passes over the row). MODE 1: accumulate the tensor's
    |x| max into amax_ptr (atomic max). MODE 2: quantize with scale max(amax, eps) / 448 read
    from amax_ptr (dynamic per-tensor, second launch). MODE 3: quantize with the given scale
    *s_ptr (static per-tensor)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_q
    if MODE == 1:
        amax = tl.zeros((ROWS,), dtype=tl.float32)
        for k in range(0, K, BK):
            cols = k + tl.arange(0, BK)
            x = tl.load(x_rows + cols[None, :], mask=rmask[:, None] & (cols[None, :] < K),
                        other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        tl.atomic_max(amax_ptr, tl.max(amax, axis=0))
    else:
        if MODE == 0:
            amax = tl.zeros((ROWS,), dtype=tl.float32)
            for k in range(0, K, BK):
                cols = k + tl.arange(0, BK)
                x = tl.load(x_rows + cols[None, :], mask=rmask[:, None] & (cols[None, :] < K),
                            other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
            scale = tl.math.div_rn(tl.maximum(amax, eps), 448.0)
            tl.store(s_ptr + rows, scale, mask=rmask)
        elif MODE == 2:
            s = tl.math.div_rn(tl.maximum(tl.load(amax_ptr), eps), 448.0)
            scale = tl.zeros((ROWS,), dtype=tl.float32) + s
            if tl.program_id(0) == 0:
                tl.store(s_ptr, s)
        else:
            scale = tl.zeros((ROWS,), dtype=tl.float32) + tl.load(s_ptr)
        for k in range(0, K, BK):
            cols = k + tl.arange(0, BK)
            m2 = rmask[:, None] & (cols[None, :] < K)
            x = tl.load(x_rows + cols[None, :], mask=m2, other=0.0).to(tl.float32)
            q = tl.clamp(tl.math.div_rn(x, scale[:, None]), -448.0, 448.0)
            tl.store(q_rows + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=m2)


def _rows_for(k: int, group: int) -> int:
    return max(1, min(16, 4096 // max(group, 1)))


def group_quant(x: torch.Tensor, group: int, eps: float, silu_mul: bool = False):
    """(q [M, K], scale [M, ceil(K / group)]) of x [M, K] (or of silu(x[:, :K]) * x[:, K:]
    when silu_mul, x [M, 2K]). group: a power of two >= 16."""
    m = x.shape[0]
    k = x.shape[1] // 2 if silu_mul else x.shape[1]
    q = _q_buffer((m, k), x.device)
    groups = triton.cdiv(k, group)
    s = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return _finish(q), s
    rows = _rows_for(k, group)
    _group_quant_kernel[(triton.cdiv(m, rows), groups)](
        x, q, s, m, k, x.stride(0), q.stride(0), s.stride(0), eps, GROUP=group, ROWS=rows,
        SILU_MUL=silu_mul, num_warps=4)
    return _finish(q), s


def row_quant(x: torch.Tensor, eps: float):
    """(q [R, K], scale [R, 1]) with one scale per row."""
    m, k = x.shape
    q = _q_buffer((m, k), x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m and k:
        _row_quant_kernel[(triton.cdiv(m, 4),)](x, q, s, s, m, k, x.stride(0), q.stride(0), eps,
                                                BK=512, ROWS=4, MODE=0, num_warps=4)
    return _finish(q), s


def tensor_quant(x: torch.Tensor, scale: torch.Tensor | None, eps: float):
    """(q like x, 0-d scale): dynamic (amax pass + quantize pass) or static scale."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    m, k = x2.shape
    q = _q_buffer((m, k), x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    if scale is not None:
        s.copy_(scale.reshape(()))
    grid = (triton.cdiv(m, 4),)
    if m and k:
        if scale is None:
            amax = torch.zeros((), dtype=torch.float32, device=x.device)
            _row_quant_kernel[grid](x2, q, s, amax, m, k, x2.stride(0), q.stride(0), eps,
                                    BK=512, ROWS=4, MODE=1, num_warps=4)
            _row_quant_kernel[grid](x2, q, s, amax, m, k, x2.stride(0), q.stride(0), eps,
                                    BK=512, ROWS=4, MODE=2, num_warps=4)
        else:
            _row_quant_kernel[grid](x2, q, s, s, m, k, x2.stride(0), q.stride(0), eps,
                                    BK=512, ROWS=4, MODE=3, num_warps=4)
    elif scale is None:
        s.fill_(eps / FP8_MAX)
    return _finish(q).view(x.shape), s


def compile_cases(kind: str) -> list[CompileCase]:
    common = {"q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "M": "i32", "K": "i32",
              "stride_x": "i32", "stride_q": "i32"}
    if kind in ("group", "silu"):
        sig = {"x_ptr": "*bf16", **common, "stride_s": "i32", "eps": "fp32"}
        return [CompileCase(_group_quant_kernel, sig,
                            dict(GROUP=128, ROWS=16, SILU_MUL=kind == "silu"),
                            aligned=("K", "stride_x", "stride_q"),
                            label=kind)]
    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "amax_ptr": "*fp32",
           "M": "i32", "K": "i32", "stride_x": "i32", "stride_q": "i32", "eps": "fp32"}
    modes = (0,) if kind == "row" else (1, 2, 3)
    return [CompileCase(_row_quant_kernel, sig, dict(BK=512, ROWS=4, MODE=mode),
                        aligned=("K", "stride_x", "stride_q"),
                        label=f"{kind} mode {mode}")
            for mode in modes]
