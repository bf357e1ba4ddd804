"""GEMM: c = a @ b.T with weights in the nn.Linear layout b [N, K].

bf16/fp16/fp32 `mm`, decode-shaped `gemv` (M <= 16, split-K kernels), and DeepSeek-V3 style
block-scaled fp8 `fp8_block_mm` (1 x block activation scales, block x block weight scales),
with the fp8 quantizers that produce its operands. Accumulation is float32 (float64 for float64
inputs).
"""
from __future__ import annotations

import torch

from tskernels_ref.gemm import quantize_fp8_block, quantize_fp8_per_token_group

from ... import _check
from ...registry import fmt, select
from . import cpu_stream, reference, torch_native  # noqa: F401  (register backends)

__all__ = ["fp8_block_mm", "gemv", "mm", "quantize_fp8_block", "quantize_fp8_per_token_group"]

GEMV_MAX_M = 16
SCALE_DTYPES = (torch.float32, torch.float64)


def _out_dtype(out_dtype) -> None:
    # _check.one_of sorts its choices, which torch dtypes do not support.
    if out_dtype not in _check.FLOAT_OR_FP64:
        raise TypeError(f"out_dtype: expected one of {_check._dt(_check.FLOAT_OR_FP64)}, "
                        f"got {out_dtype!r}")


def _operands(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None) -> dict:
    _check.tensor("a", a, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("b", b, ndim=2, dtypes=(a.dtype,), shape=(None, a.shape[1]), device=a.device)
    if out_dtype is not None:
        _out_dtype(out_dtype)
    return dict(device=a.device, formats={"a": fmt(a.dtype), "b": fmt(b.dtype),
                                          "c": fmt(out_dtype or a.dtype)})


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
       backend: str | None = None) -> torch.Tensor:
    """c = a @ b.T.

    a: [M, K] fp32/fp16/bf16. b: [N, K] weight (nn.Linear layout), a's dtype and device.
    out_dtype: dtype of c (default a.dtype). Returns c [M, N].

    >>> import torch, tskernels
    >>> tskernels.gemm.mm(torch.ones(2, 3), torch.ones(4, 3)).shape
    torch.Size([2, 4])
    """
    prob = _operands(a, b, out_dtype)
    return select("gemm", "mm", backend=backend, **prob)(a, b, out_dtype=out_dtype)


def gemv(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
         backend: str | None = None) -> torch.Tensor:
    """Decode-shaped c = a @ b.T (the kernels split K across programs); same math as `mm`.

    a: [M, K] with M <= 16, fp32/fp16/bf16. b: [N, K], a's dtype and device.
    out_dtype: dtype of c (default a.dtype). Returns c [M, N].
    """
    prob = _operands(a, b, out_dtype)
    if a.shape[0] > GEMV_MAX_M:
        raise ValueError(f"a: gemv takes at most {GEMV_MAX_M} rows, got {a.shape[0]} "
                         "(use gemm.mm)")
    return select("gemm", "gemv", backend=backend, **prob)(a, b, out_dtype=out_dtype)


def fp8_block_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                 *, out_dtype: torch.dtype = torch.bfloat16, block: int = 128,
                 backend: str | None = None) -> torch.Tensor:
    """Block-scaled fp8 GEMM: c = dequant(a) @ dequant(b).T, where

        dequant(a)[m, k] = a[m, k] * a_scale[m, k // block]
        dequant(b)[n, k] = b[n, k] * b_scale[n // block, k // block]

    a: float8_e4m3fn [M, K]. a_scale: float32 [M, ceil(K / block)] (per-token-group, from
    `quantize_fp8_per_token_group`). b: float8_e4m3fn [N, K]. b_scale: float32
    [ceil(N / block), ceil(K / block)] (from `quantize_fp8_block`). All on one device.
    block: positive tile size. Returns c [M, N] in out_dtype (bf16 by default).
    """
    if not (isinstance(block, int) and block > 0):
        raise ValueError(f"block: expected a positive int, got {block!r}")
    _check.tensor("a", a, ndim=2, dtypes=_check.FP8)
    m, k = a.shape
    _check.tensor("b", b, ndim=2, dtypes=_check.FP8, shape=(None, k), device=a.device)
    n = b.shape[0]
    kb = -(-k // block)
    _check.tensor("a_scale", a_scale, dtypes=SCALE_DTYPES, shape=(m, kb), device=a.device)
    _check.tensor("b_scale", b_scale, dtypes=SCALE_DTYPES, shape=(-(-n // block), kb),
                  device=a.device)
    _out_dtype(out_dtype)
    kern = select("gemm", "fp8_block_mm", device=a.device,
                  formats={"a": fmt(a.dtype), "b": fmt(b.dtype), "c": fmt(out_dtype)},
                  traits={"block": block}, backend=backend)
    return kern(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block)
