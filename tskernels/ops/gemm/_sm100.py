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
