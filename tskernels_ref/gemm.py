"""GEMM references: bf16/fp16/fp32 mm, decode GEMV, fp8 block-scaled mm and its quantizers.

Weights use the nn.Linear layout b [N, K]; every op computes c = a @ b.T with float32
accumulation (float64 for float64 inputs).
"""
from __future__ import annotations

import torch

from ._common import FP8_DTYPE, FP8_MAX, compute_dtype


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


def gemv(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode-shaped c = a @ b.T with M <= 16 (the kernels use split-K); same math as `mm`.

    Args:
        a: [M, K], M <= 16.
        b: [N, K].
        out_dtype: dtype of c (default a.dtype).
    Returns:
        c [M, N].
    """
    return mm(a, b, out_dtype=out_dtype)


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
