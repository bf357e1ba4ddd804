"""GEMM references: bf16/fp16/fp32 mm, decode GEMV, fp8 block-scaled mm and its quantizers.

Weights use the nn.Linear layout b [N, K]; every op computes c = a @ b.T with float32
accumulation (float64 for float64 inputs).
"""
from __future__ import annotations

import torch

from ._common import FP8_DTYPE, FP8_MAX, compute_dtype
from .activation import silu_and_mul as _silu_and_mul
from .norm import rmsnorm as _rmsnorm


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """c = a @ b.T.

    Args:
        a: [M, K] activations.
        b: [N, K] weight (nn.Linear layout), same dtype family as a.
        out_dtype: dtype of c (default a.dtype).
    Returns:
        c [M, N].
    """
    dtype = compute_dtype(a, b)
    c = a.to(dtype) @ b.to(dtype).T
    return c.to(out_dtype or a.dtype)


def gemv(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """Decode-shaped c = a @ b.T (+ residual) with M <= 16 (the kernels use split-K).

    Args:
        a: [M, K], M <= 16.
        b: [N, K].
        out_dtype: dtype of c (default a.dtype).
        residual: optional [M, N], added to the float32 (float64) product before the one
            rounding to out_dtype (a fused residual-add epilogue).
    Returns:
        c [M, N].
    """
    if residual is None:
        return mm(a, b, out_dtype=out_dtype)
    dtype = compute_dtype(a, b, residual)
    c = a.to(dtype) @ b.to(dtype).T + residual.to(dtype)
    return c.to(out_dtype or a.dtype)


def _expand_scale(scale: torch.Tensor, rows: int, cols: int, row_block: int, col_block: int) -> torch.Tensor:
    """Blockwise scale [ceil(rows/rb), ceil(cols/cb)] -> elementwise [rows, cols]."""
    s = scale.repeat_interleave(row_block, dim=0)[:rows]
    return s.repeat_interleave(col_block, dim=1)[:, :cols]


def fp8_block_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    block: int = 128,
) -> torch.Tensor:
    """DeepSeek-V3 style block-scaled fp8 GEMM: c = dequant(a) @ dequant(b).T.

        dequant(a)[m, k] = a[m, k] * a_scale[m, k // block]
        dequant(b)[n, k] = b[n, k] * b_scale[n // block, k // block]

    Args:
        a: float8_e4m3fn [M, K].
        a_scale: float32 [M, ceil(K / block)] (1 x block per-token-group scales).
        b: float8_e4m3fn [N, K].
        b_scale: float32 [ceil(N / block), ceil(K / block)] (block x block weight scales).
        out_dtype: dtype of c.
    Returns:
        c [M, N] in out_dtype.
    """
    m, k = a.shape
    n = b.shape[0]
    dtype = torch.float64 if a_scale.dtype == torch.float64 else torch.float32
    a_deq = a.to(dtype) * _expand_scale(a_scale.to(dtype), m, k, 1, block)
    b_deq = b.to(dtype) * _expand_scale(b_scale.to(dtype), n, k, block, block)
    return (a_deq @ b_deq.T).to(out_dtype)


def _safe_scale(amax: torch.Tensor, eps: float) -> torch.Tensor:
    return amax.clamp(min=eps) / FP8_MAX


def quantize_fp8_per_token_group(
    x: torch.Tensor, group: int = 128, *, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group fp8 quantization (activations).

    scale[m, g] = max(|x[m, g*group:(g+1)*group]|, eps) / 448;  q = clamp(x / scale, +-448) -> e4m3.

    Args:
        x: [M, K] float.
    Returns:
        (q float8_e4m3fn [M, K], scale float32 [M, ceil(K / group)]).
    """
    m, k = x.shape
    groups = -(-k // group)
    xf = torch.nn.functional.pad(x.float(), (0, groups * group - k)).view(m, groups, group)
    scale = _safe_scale(xf.abs().amax(dim=-1), eps)
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).view(m, groups * group)[:, :k]
    return q.to(FP8_DTYPE), scale


def quantize_fp8_block(
    w: torch.Tensor, block: int = 128, *, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise fp8 quantization (weights): one scale per block x block tile.

    scale[i, j] = max(|w[tile i, j]|, eps) / 448;  q = clamp(w / scale, +-448) -> e4m3.

    Args:
        w: [N, K] float.
    Returns:
        (q float8_e4m3fn [N, K], scale float32 [ceil(N / block), ceil(K / block)]).
    """
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wf = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    tiles = wf.view(nb, block, kb, block)
    scale = _safe_scale(tiles.abs().amax(dim=(1, 3)), eps)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * block, kb * block)
    return q[:n, :k].to(FP8_DTYPE), scale


def quantize_fp8_per_tensor(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 quantization: one scale for the whole tensor.

    Dynamic (scale None): scale = max(|x|, eps) / 448. Static: the given scale (a 1-element
    float tensor). q = clamp(x / scale, +-448) -> e4m3.

    Args:
        x: [..] float.
    Returns:
        (q float8_e4m3fn like x, scale float32 0-d tensor).
    """
    xf = x.float()
    if scale is None:
        s = _safe_scale(xf.abs().amax(), eps)
    else:
        s = scale.float().reshape(())
    q = (xf / s).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE), s


def quantize_fp8_per_channel(
    x: torch.Tensor, *, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 quantization (per output channel of a weight [N, K], per token of an
    activation [M, K]): scale[r] = max(|x[r]|, eps) / 448; q = clamp(x / scale, +-448).

    Args:
        x: [R, K] float.
    Returns:
        (q float8_e4m3fn [R, K], scale float32 [R, 1]).
    """
    xf = x.float()
    s = _safe_scale(xf.abs().amax(dim=-1, keepdim=True), eps)
    return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), s


def silu_and_mul_quantize_fp8(
    x: torch.Tensor, group: int = 128, *, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = silu(x[:, :I]) * x[:, I:] in float32, then per-token-group fp8 quantization of y
    (no rounding of y to x's dtype in between): the input a block-fp8 down projection takes.

    Args:
        x: [M, 2I] float (gate half first, then up half).
    Returns:
        (q float8_e4m3fn [M, I], scale float32 [M, ceil(I / group)]).
    """
    half = x.shape[-1] // 2
    gate, up = x[:, :half].float(), x[:, half:].float()
    return quantize_fp8_per_token_group(torch.nn.functional.silu(gate) * up, group, eps=eps)


def int8w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, *, act_int8: bool = False,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Weight-only int8 GEMM: c = a @ (q * scale[:, None]).T.

    With act_int8 (K a multiple of 32), a is first quantized per group of 32
    (quantize_act_int8_groups) and
        c[i, n] = scale[n] sum_g sx[i, g] (xq[i, g] . q[n, g])
    (GGUF's Q8_0 x Q8_0 form: integer dot products).

    Args:
        a: [M, K] activations (fp32/bf16/fp16/fp64).
        q: [N, K] int8 weight (nn.Linear layout).
        scale: [N] float32, one scale per output row.
        out_dtype: dtype of c (default a.dtype).
    Returns:
        c [M, N]; computed in float32 (float64 for float64 a).
    """
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    if act_int8:
        xq, sx, _ = quantize_act_int8_groups(a)
        m, k = a.shape
        xs = (xq.to(acc).view(m, -1, 32) * sx.to(acc)[..., None]).reshape(m, k)
        return ((xs @ q.to(acc).T) * scale.to(acc)).to(out_dtype or a.dtype)
    w = q.to(acc) * scale.to(acc)[:, None]
    return (a.to(acc) @ w.T).to(out_dtype or a.dtype)


def quantize_act_int8_groups(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a [M, K] (K a multiple of 32) in float32, per group of 32 along K: sx = max|a| / 127,
    xq = round(a * (127 / max|a|)) in [-127, 127] (0 for an all-zero group), and the group
    sums of a. Returns (xq float32 [M, K] holding integers, sx [M, K / 32], sums [M, K / 32]),
    the float32 arithmetic of tskernels/csrc/cpu_gemm_q4a8.inc step for step."""
    m, k = a.shape
    x = a.to(torch.float32).reshape(m, k // 32, 32)
    amax = x.abs().amax(dim=2)
    # a tensor / tensor division, one rounding like the kernel's 127.f / amax (a Python scalar
    # over a tensor is computed as reciprocal() * 127: two roundings, off by an ulp at times,
    # which flips round(x * inv) at ties)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0)
                      / amax.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(amax))
    xq = torch.round(x * inv[..., None]).clamp_(-127, 127).reshape(m, k)
    return xq, amax / 127.0, x.sum(dim=2)


def q4w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, mins: torch.Tensor, *,
           act_int8: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Weight-only 4-bit GEMM: c = a @ W.T, W dequantized from groups of 32 along K.

    With act_int8, a is first quantized per group of 32 (quantize_act_int8_groups) and
        c[i, n] = sum_g scale[n, g] sx[i, g] (xq[i, g] . q[n, g]) + mins[n, g] sum(a[i, g])
    (GGUF's Q4_1 x Q8_1 form: integer dot products; the offset term from a's float sums).

    Args:
        a: [M, K] activations (fp32/bf16/fp16/fp64), K a multiple of 32.
        q: [N, K / 2] uint8: group g of row n is q[n, 16g : 16g + 16]; byte j holds element
            32g + j in its low nibble and element 32g + 16 + j in its high nibble.
        scale, mins: [N, K / 32] float32; W[n, 32g + i] = scale[n, g] * nibble + mins[n, g].
        out_dtype: dtype of c (default a.dtype).
    Returns:
        c [M, N]; computed in float32 (float64 for float64 a).
    """
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    n, half = q.shape
    g = q.view(n, half // 16, 16)
    nib = torch.cat([g & 15, g >> 4], dim=2).to(acc)  # [N, groups, 32]
    if act_int8:
        xq, sx, sums = quantize_act_int8_groups(a)
        m = a.shape[0]
        xs = (xq.to(acc).view(m, -1, 32) * sx.to(acc)[..., None]).reshape(m, 2 * half)
        wd = (nib * scale.to(acc)[..., None]).reshape(n, 2 * half)
        c = xs @ wd.T + sums.to(acc) @ mins.to(acc).T
        return c.to(out_dtype or a.dtype)
    w = (nib * scale.to(acc)[..., None] + mins.to(acc)[..., None]).reshape(n, 2 * half)
    return (a.to(acc) @ w.T).to(out_dtype or a.dtype)


def rmsnorm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, b: torch.Tensor, *,
                 eps: float = 1e-6, out_dtype: torch.dtype | None = None,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """c = rmsnorm(x, norm_weight, eps) @ b.T (+ residual): the unfused pair, the normed x
    rounded to x.dtype in between (as norm.rmsnorm returns it).

    Args:
        x: [M, K]. norm_weight: [K]. b: [N, K]. residual: optional [M, N].
    Returns:
        c [M, N] in out_dtype (default x.dtype).
    """
    return gemv(_rmsnorm(x, norm_weight, eps), b, out_dtype=out_dtype, residual=residual)


def silu_mul_gemv(x: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """c = silu_and_mul(x) @ b.T (+ residual): the unfused pair, silu(gate) * up rounded to
    x.dtype in between (as activation.silu_and_mul returns it).

    Args:
        x: [M, 2K] (gate half first). b: [N, K]. residual: optional [M, N].
    Returns:
        c [M, N] in out_dtype (default x.dtype).
    """
    return gemv(_silu_and_mul(x), b, out_dtype=out_dtype, residual=residual)
