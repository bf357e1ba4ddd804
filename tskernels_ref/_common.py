"""Helpers shared by the reference ops: compute dtype, fp8 scales, paged-KV gathers."""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any floating input is float64, else float32."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def scale_for_heads(scale: torch.Tensor | float | None, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Per-tensor (0-d / 1-element) or per-head [num_heads] scale -> [num_heads, 1] in `dtype`."""
    if scale is None:
        return torch.ones(num_heads, 1, dtype=dtype)
    s = torch.as_tensor(scale, dtype=dtype).reshape(-1)
    if s.numel() == 1:
        s = s.expand(num_heads)
    return s.reshape(num_heads, 1)


def dequant(x: torch.Tensor, scale: torch.Tensor | float | None, dtype: torch.dtype) -> torch.Tensor:
    """x [..., H, D] -> float `dtype`; fp8 values are multiplied by their (per-tensor or per-head) scale."""
    y = x.to(dtype)
    if is_fp8(x) and scale is not None:
        y = y * scale_for_heads(scale, x.shape[-2], dtype).to(y.device)
    return y


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | float | None, dtype: torch.dtype = FP8_DTYPE) -> torch.Tensor:
    """x [..., H, D] -> fp8: clamp(x / scale, +-448), round to nearest e4m3."""
    xf = x.float()
    if scale is not None:
        xf = xf / scale_for_heads(scale, x.shape[-2], torch.float32).to(x.device)
    return xf.clamp(-FP8_MAX, FP8_MAX).to(dtype)


def gather_pages(cache: torch.Tensor, page_row: torch.Tensor, length: int) -> torch.Tensor:
    """First `length` tokens of one request from a paged cache [num_pages, page_size, ...].

    Only the pages the request needs are read, so unused page-table entries may hold anything.
    """
    page_size = cache.shape[1]
    n_pages = -(-length // page_size)
    pages = page_row[:n_pages].long()
    return cache[pages].reshape(n_pages * page_size, *cache.shape[2:])[:length]
