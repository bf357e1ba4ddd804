"""Weight-only 4-bit GEMM: c = a @ W.T with W [N, K] kept as 4-bit values in groups of 32
along K, each group with a float32 scale and offset (asymmetric: W = scale * q + min, q in
0..15), plus the quantizer that makes them.

The layout is GGUF's Q4_1 block (16 bytes per group: byte j holds element j in its low nibble
and element 16 + j in its high one) with float32 instead of fp16 scales: 0.75 bytes per weight
with the scales (int8 + row scale: ~1, fp32: 4). A CPU decode step at batch 1 is bound by
streaming the weights, so it reads ~1.3x fewer bytes than int8. The reference dequantizes and
multiplies; the CPU backend ("cpu_stream", tskernels/csrc/cpu_gemm.cpp) widens each group as
it streams it and multiplies it into every row of `a`.
"""
from __future__ import annotations

import torch

import tskernels_ref.gemm as ref

from ... import _check
from ...registry import ANY_DEVICE, fmt, register, select

GROUP = 32


def quantize_q4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit quantization of a weight w [N, K] (fp32/bf16/fp16/fp64, K a multiple
    of 32) per group of 32 along K: mins = group min, scale = (max - min) / 15 (0 for a
    constant group), q = round((w - min) / scale) in [0, 15].

    Returns (q uint8 [N, K / 2] packed as gemm.q4w_mm reads it, scale float32 [N, K / 32],
    mins float32 [N, K / 32]); the error is at most scale / 2 per element (plus float32
    rounding of scale and min).
    """
    _check.tensor("w", w, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"w: K = {k} must be a multiple of {GROUP} for 4-bit groups")
    wf = w.detach().to(torch.float64).view(n, k // GROUP, GROUP)
    lo, hi = wf.amin(dim=2), wf.amax(dim=2)
    scale = ((hi - lo) / 15).to(torch.float32)
    mins = lo.to(torch.float32)
    s64 = scale.double()[..., None]
    q = torch.where(s64 > 0, torch.round((wf - mins.double()[..., None]) / s64.clamp_min(1e-300)),
                    torch.zeros_like(wf)).clamp_(0, 15).to(torch.uint8)
    packed = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, k // 2).contiguous()
    return packed, scale.contiguous(), mins.contiguous()


def q4w_mm(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, mins: torch.Tensor, *,
           act_int8: bool = False, out_dtype: torch.dtype | None = None,
           backend: str | None = None) -> torch.Tensor:
    """c = a @ W.T with W = scale * q + mins per group of 32 along K.

    act_int8: quantize a per group of 32 to int8 first and multiply in integers, as GGUF's
    Q4_1 x Q8_1 does (tskernels_ref.gemm.q4w_mm gives the exact formula): about half the CPU
    work per weight of widening W to float, at the error of 8-bit activations.

    a: [M, K] fp32/bf16/fp16/fp64, K a multiple of 32. q: uint8 [N, K / 2] on a's device
    (from quantize_q4_groups). scale, mins: float32 [N, K / 32]. out_dtype: dtype of c
    (default a.dtype). Returns c [M, N].

    >>> import torch, tskernels
    >>> q, s, m = tskernels.gemm.quantize_q4_groups(torch.ones(2, 32))
    >>> tskernels.gemm.q4w_mm(torch.ones(1, 32), q, s, m)
    tensor([[32., 32.]])
    """
    _check.tensor("a", a, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    k = a.shape[1]
    if k % GROUP:
        raise ValueError(f"a: K = {k} must be a multiple of {GROUP} for 4-bit weights")
    _check.tensor("q", q, ndim=2, dtypes=(torch.uint8,), shape=(None, k // 2), device=a.device)
    for name, t in (("scale", scale), ("mins", mins)):
        _check.tensor(name, t, dtypes=(torch.float32,), shape=(q.shape[0], k // GROUP),
                      device=a.device)
    if out_dtype is not None and out_dtype not in _check.FLOAT_OR_FP64:
        raise TypeError(f"out_dtype: expected a floating dtype, got {out_dtype!r}")
    kern = select("gemm", "q4w_mm", device=a.device, backend=backend,
                  formats={"a": fmt(a.dtype), "b": "uint4", "c": fmt(out_dtype or a.dtype)})
    return kern(a, q, scale, mins, act_int8=act_int8, out_dtype=out_dtype)


@register("gemm", "q4w_mm", backend="reference", capability=ANY_DEVICE, band="reference",
          tags=("deterministic",), run_verified=("cpu",),
          formats={"a": ("fp32", "bf16", "fp16", "fp64"), "b": ("uint4",),
                   "c": ("fp32", "bf16", "fp16", "fp64")})
def q4w_mm_reference(a, q, scale, mins, *, act_int8=False, out_dtype=None):
    """Dequantize (float32, float64 for float64 a) and multiply (tskernels_ref.gemm)."""
    return ref.q4w_mm(a, q, scale, mins, act_int8=act_int8, out_dtype=out_dtype)
