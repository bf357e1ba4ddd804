"""Weight-only int8 GEMM: c = a @ (q * scale[:, None]).T with int8 weights q [N, K] (the
nn.Linear layout) and one float32 scale per output row, plus the quantizer that makes them.

The weights stay packed (1 byte per value) in memory; a CPU decode step, bound by streaming the
weights, reads 4x fewer bytes than from fp32 and 2x fewer than from bf16. The reference
dequantizes to float32 (float64 for a float64 `a`) and multiplies; the CPU backend
("cpu_stream", tskernels/csrc/cpu_gemm.cpp) widens the int8 values as it streams them and
applies the scale once per output.
"""
from __future__ import annotations

import torch

import tskernels_ref.gemm as ref

from ... import _check
from ...registry import ANY_DEVICE, fmt, register, select

QMAX = 127


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 quantization of a weight w [N, K] (fp32/bf16/fp16/fp64):
    scale[n] = max|w[n]| / 127 (1 for an all-zero row), q = round(w / scale) in [-127, 127].

    Returns (q int8 [N, K] contiguous, scale float32 [N]); w ~= q * scale[:, None] with an
    error of at most scale / 2 per element.
    """
    _check.tensor("w", w, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    wf = w.detach().to(torch.float64)
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(wf / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8).contiguous()
    return q, scale.to(torch.float32).contiguous()


def int8w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, *, act_int8: bool = False,
             out_dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """c = a @ (q * scale[:, None]).T.

    act_int8: quantize a per group of 32 along K to int8 first (K a multiple of 32) and
    multiply in integers, as GGUF's Q8_0 x Q8_0 does (tskernels_ref.gemm.int8w_mm gives the
    exact formula): fewer CPU instructions per weight than widening q to float, at the error
    of 8-bit activations.

    a: [M, K] fp32/bf16/fp16/fp64. q: int8 [N, K] on a's device. scale: float32 [N].
    out_dtype: dtype of c (default a.dtype). Returns c [M, N].

    >>> import torch, tskernels
    >>> q, s = tskernels.gemm.quantize_int8_per_channel(torch.ones(4, 3))
    >>> tskernels.gemm.int8w_mm(torch.ones(2, 3), q, s)
    tensor([[3., 3., 3., 3.],
            [3., 3., 3., 3.]])
    """
    _check.tensor("a", a, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("q", q, ndim=2, dtypes=(torch.int8,), shape=(None, a.shape[1]),
                  device=a.device)
    _check.tensor("scale", scale, dtypes=(torch.float32,), shape=(q.shape[0],),
                  device=a.device)
    if out_dtype is not None and out_dtype not in _check.FLOAT_OR_FP64:
        raise TypeError(f"out_dtype: expected a floating dtype, got {out_dtype!r}")
    if act_int8 and a.shape[1] % 32:
        raise ValueError(f"a: act_int8 needs K a multiple of 32 (groups of 32), got K = "
                         f"{a.shape[1]}")
    kern = select("gemm", "int8w_mm", device=a.device, backend=backend,
                  formats={"a": fmt(a.dtype), "b": "int8", "c": fmt(out_dtype or a.dtype)})
    return kern(a, q, scale, act_int8=act_int8, out_dtype=out_dtype)


@register("gemm", "int8w_mm", backend="reference", capability=ANY_DEVICE, band="reference",
          tags=("deterministic",), run_verified=("cpu",),
          formats={"a": ("fp32", "bf16", "fp16", "fp64"), "b": ("int8",),
                   "c": ("fp32", "bf16", "fp16", "fp64")})
def int8w_mm_reference(a, q, scale, *, act_int8=False, out_dtype=None):
    """Dequantize (float32, float64 for float64 a) and multiply (tskernels_ref.gemm)."""
    return ref.int8w_mm(a, q, scale, act_int8=act_int8, out_dtype=out_dtype)
