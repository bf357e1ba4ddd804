"""What the two Blackwell GEMM launchers (one-CTA `cuda_mm_sm100`, 2-CTA `cuda_mm_sm100_2cta`)
share: the targets, the NVRTC options and the operands' TMA padding. Family-private, not a
backend (it registers nothing)."""
from __future__ import annotations

import torch

from .. import cuda_driver

ARCHS = {(10, 0): "sm_100a", (10, 3): "sm_103a"}


def nvcc_options(fp16: bool, out_fp16: bool) -> tuple[str, ...]:
    return ("-std=c++17", cuda_driver.INCLUDE, *(("-DFP16",) if fp16 else ()),
            *(("-DOUT_F16",) if out_fp16 else ()))


def _pad_k(t: torch.Tensor, k8: int) -> torch.Tensor:
    """t [rows, K] with unit last stride, 16-byte-aligned rows and base (TMA's requirements),
    zero columns up to k8 (zeros add nothing to the products)."""
    if t.shape[1] == k8 and t.stride(1) == 1 and t.stride(0) % 8 == 0 and \
            t.data_ptr() % 16 == 0:
        return t
    out = t.new_zeros(t.shape[0], k8)
    out[:, :t.shape[1]] = t
    return out


def prepare(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None, who: str):
    """The checks and buffers both launchers start with: a [M, K] and b [N, K] of one 16-bit
    dtype on one CUDA device, c [M, N8] (N padded to 8: the epilogue stores 8 outputs at a
    time). Returns (c, a, b, k8, early): early is the answer when there is nothing to
    multiply (M, N or K zero), else None and a / b are K-padded to k8 for TMA."""
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise ValueError(f"{who}: a and b must both be bf16 or both fp16, got {a.dtype} and "
                         f"{b.dtype}")
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{who}: out_dtype bf16 or fp16, got {out_dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1] or a.device != b.device or \
            a.device.type != "cuda":
        raise ValueError(f"{who}: a [M, K] and b [N, K] on one CUDA device, got "
                         f"{tuple(a.shape)} on {a.device} and {tuple(b.shape)} on {b.device}")
    (M, K), N = a.shape, b.shape[0]
    c = torch.empty(M, -(-N // 8) * 8, dtype=out_dtype, device=a.device)
    k8 = -(-K // 8) * 8
    if M == 0 or N == 0:
        return c, a, b, k8, c[:, :N]
    if K == 0:
        return c, a, b, k8, c.zero_()[:, :N]
    return c, _pad_k(a, k8), _pad_k(b, k8), k8, None
