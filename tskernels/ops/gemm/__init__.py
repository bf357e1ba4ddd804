"""GEMM: c = a @ b.T with weights in the nn.Linear layout b [N, K].

bf16/fp16/fp32 `mm`, decode-shaped `gemv` (M <= 16, split-K kernels, optional fused residual
add) and its fused forms `rmsnorm_gemv` / `silu_mul_gemv` (the norm or gated activation before
it computed on the activation tile), and DeepSeek-V3 style block-scaled fp8 `fp8_block_mm` (1 x block activation scales,
block x block weight scales), with the fp8 (e4m3) quantizers that produce its operands:
per-token-group (`quantize_fp8_per_token_group`, and `silu_and_mul_quantize_fp8` fused with
a gated MLP's activation), per-row (`quantize_fp8_per_channel`), per-tensor
(`quantize_fp8_per_tensor`) and 128 x 128 weight blocks (`quantize_fp8_block`, offline,
reference only). Accumulation is float32 (float64 for float64 inputs).
"""
from __future__ import annotations

import torch

from tskernels_ref.gemm import quantize_fp8_block

from ... import _check
from ...registry import fmt, select
from . import cpu_stream, reference, torch_native  # noqa: F401  (register backends)
from . import triton_fp8, triton_gemv, triton_gemv_fused, triton_mm  # noqa: F401  (backends)
from . import cuda_fp8_sm90  # noqa: F401  (Hopper block-fp8 GEMM, wgmma + TMA)
from . import cuda_mm_sm100  # noqa: F401  (Blackwell tcgen05: compiled, not run)
from . import cuda_mm_sm100_2cta  # noqa: F401  (Blackwell CTA pairs: compiled, not run, opt-in)
from .int8w import int8w_mm, quantize_int8_per_channel
from .q4w import q4w_mm, quantize_q4_groups

__all__ = ["fp8_block_mm", "gemv", "int8w_mm", "mm", "q4w_mm", "quantize_fp8_block",
           "quantize_fp8_per_channel", "quantize_fp8_per_tensor", "quantize_fp8_per_token_group",
           "quantize_int8_per_channel", "quantize_q4_groups", "rmsnorm_gemv",
           "silu_and_mul_quantize_fp8", "silu_mul_gemv"]

GEMV_MAX_M = 16
GEMV_FP8_MAX_M = 64  # fp8_block_mm rows the Triton backend streams the weight for (decode)
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
         residual: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """Decode-shaped c = a @ b.T (+ residual); the kernels split K across programs.

    a: [M, K] with M <= 16, fp32/fp16/bf16. b: [N, K], a's dtype and device.
    out_dtype: dtype of c (default a.dtype). residual: optional [M, N] (a's dtype), added to
    the fp32 product before the one rounding to out_dtype (a fused residual-add epilogue).
    Returns c [M, N].

    >>> import torch, tskernels
    >>> tskernels.gemm.gemv(torch.ones(1, 3), torch.ones(2, 3), residual=torch.ones(1, 2))
    tensor([[4., 4.]])
    """
    prob = _operands(a, b, out_dtype)
    if a.shape[0] > GEMV_MAX_M:
        raise ValueError(f"a: gemv takes at most {GEMV_MAX_M} rows, got {a.shape[0]} "
                         "(use gemm.mm)")
    if residual is None:
        return select("gemm", "gemv", backend=backend, **prob)(a, b, out_dtype=out_dtype)
    _check.tensor("residual", residual, dtypes=(a.dtype,), shape=(a.shape[0], b.shape[0]),
                  device=a.device)
    kern = select("gemm", "gemv", backend=backend, traits={"residual": True}, **prob)
    if "residual" in kern.traits:
        return kern(a, b, out_dtype=out_dtype, residual=residual)
    # a backend without the fused epilogue: its fp32 product plus the residual, rounded once
    c = kern(a, b, out_dtype=torch.float64 if a.dtype == torch.float64 else torch.float32)
    return (c + residual.to(c.dtype)).to(out_dtype or a.dtype)


def _fused_gemv(op: str, x: torch.Tensor, b: torch.Tensor, k: int, out_dtype, residual,
                backend, **kw) -> torch.Tensor:
    """Checks and selection shared by the fused decode gemvs; x [M, *] with M <= 16."""
    _check.tensor("x", x, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("b", b, ndim=2, dtypes=(x.dtype,), shape=(None, k), device=x.device)
    if out_dtype is not None:
        _out_dtype(out_dtype)
    if x.shape[0] > GEMV_MAX_M:
        raise ValueError(f"x: {op} takes at most {GEMV_MAX_M} rows, got {x.shape[0]}")
    formats = {"x": fmt(x.dtype), "b": fmt(b.dtype), "c": fmt(out_dtype or x.dtype)}
    if residual is not None:
        _check.tensor("residual", residual, dtypes=(x.dtype,), shape=(x.shape[0], b.shape[0]),
                      device=x.device)
    kern = select("gemm", op, device=x.device, formats=formats, backend=backend,
                  traits={"residual": True} if residual is not None else None)
    return kern(x, *kw.pop("args"), b, out_dtype=out_dtype, residual=residual, **kw)


def rmsnorm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, b: torch.Tensor, *,
                 eps: float = 1e-6, out_dtype: torch.dtype | None = None,
                 residual: torch.Tensor | None = None,
                 backend: str | None = None) -> torch.Tensor:
    """c = norm.rmsnorm(x, norm_weight, eps) @ b.T (+ residual) in one launch (decode rows).

    The normed x is rounded to x.dtype before the product, as the unfused pair rounds it, so
    both agree to the product's rounding. x: [M, K] with M <= 16, fp32/fp16/bf16.
    norm_weight: [K] float, x's device. b: [N, K], x's dtype and device. eps: positive.
    out_dtype: dtype of c (default x.dtype). residual: optional [M, N] (x's dtype), added to
    the fp32 product before the one rounding to out_dtype. Returns c [M, N].

    >>> import torch, tskernels
    >>> tskernels.gemm.rmsnorm_gemv(torch.full((1, 4), 3.0), torch.ones(4), torch.ones(2, 4))
    tensor([[4., 4.]])
    """
    _check.tensor("x", x, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    _check.tensor("norm_weight", norm_weight, ndim=1, dtypes=_check.FLOAT_OR_FP64,
                  shape=(x.shape[1],), device=x.device)
    _eps(eps)
    return _fused_gemv("rmsnorm_gemv", x, b, x.shape[1], out_dtype, residual, backend,
                       args=(norm_weight,), eps=float(eps))


def silu_mul_gemv(x: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
                  residual: torch.Tensor | None = None,
                  backend: str | None = None) -> torch.Tensor:
    """c = activation.silu_and_mul(x) @ b.T (+ residual) in one launch (decode rows): a gated
    MLP's down projection over its gate|up output.

    silu(gate) * up is rounded to x.dtype before the product, as the unfused pair rounds it.
    x: [M, 2K] (gate half first) with M <= 16, fp32/fp16/bf16. b: [N, K], x's dtype and
    device. out_dtype / residual: as `gemv`. Returns c [M, N].

    >>> import torch, tskernels
    >>> tskernels.gemm.silu_mul_gemv(torch.zeros(1, 4), torch.ones(3, 2))
    tensor([[0., 0., 0.]])
    """
    _check.tensor("x", x, ndim=2, dtypes=_check.FLOAT_OR_FP64)
    if x.shape[1] % 2:
        raise ValueError(f"x: expected an even last dimension (gate and up halves), got "
                         f"{tuple(x.shape)}")
    return _fused_gemv("silu_mul_gemv", x, b, x.shape[1] // 2, out_dtype, residual, backend,
                       args=())


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
    # large_m: more rows than the decode kernels take (a bool, so selections cache per bucket)
    kern = select("gemm", "fp8_block_mm", device=a.device,
                  formats={"a": fmt(a.dtype), "b": fmt(b.dtype), "c": fmt(out_dtype)},
                  traits={"block": block, "large_m": m > GEMV_FP8_MAX_M}, backend=backend)
    return kern(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block)


def _quant_input(x: torch.Tensor, name: str = "x") -> None:
    _check.tensor(name, x, ndim=2, dtypes=_check.FLOAT)


def _eps(eps: float) -> None:
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps: expected a positive float, got {eps!r}")


def _group(group: int) -> None:
    if not (isinstance(group, int) and group > 0):
        raise ValueError(f"group: expected a positive int, got {group!r}")


def quantize_fp8_per_token_group(x: torch.Tensor, group: int = 128, *, eps: float = 1e-10,
                                 backend: str | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group fp8 e4m3 quantization (the activations of `fp8_block_mm`).

    scale[m, g] = max(|x[m, g*group:(g+1)*group]|, eps) / 448; q = clamp(x / scale, +-448).
    x: [M, K] fp32/fp16/bf16. Returns (q float8_e4m3fn [M, K], scale float32
    [M, ceil(K / group)]). The Triton kernel takes power-of-two groups of 16..4096.
    """
    _quant_input(x)
    _group(group)
    _eps(eps)
    kern = select("gemm", "quantize_fp8_per_token_group", device=x.device,
                  formats={"x": fmt(x.dtype)}, traits={"group": group}, backend=backend)
    return kern(x, group, eps=eps)


def silu_and_mul_quantize_fp8(x: torch.Tensor, group: int = 128, *, eps: float = 1e-10,
                              backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """y = silu(x[:, :I]) * x[:, I:] (fp32, not rounded), then per-token-group fp8 quantization
    of y: what a block-fp8 gated MLP / MoE feeds its down projection.

    x: [M, 2I] fp32/fp16/bf16 (gate half first). Returns (q float8_e4m3fn [M, I], scale float32
    [M, ceil(I / group)]).
    """
    _quant_input(x)
    if x.shape[1] % 2:
        raise ValueError(f"x: expected an even last dimension (gate and up halves), got "
                         f"{tuple(x.shape)}")
    _group(group)
    _eps(eps)
    kern = select("gemm", "silu_and_mul_quantize_fp8", device=x.device,
                  formats={"x": fmt(x.dtype)}, traits={"group": group}, backend=backend)
    return kern(x, group, eps=eps)


def quantize_fp8_per_channel(x: torch.Tensor, *, eps: float = 1e-10,
                             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp8 scale per row: per output channel of a weight [N, K], per token of an
    activation [M, K]. scale[r] = max(|x[r]|, eps) / 448.

    x: [R, K] fp32/fp16/bf16. Returns (q float8_e4m3fn [R, K], scale float32 [R, 1]).
    """
    _quant_input(x)
    _eps(eps)
    kern = select("gemm", "quantize_fp8_per_channel", device=x.device,
                  formats={"x": fmt(x.dtype)}, backend=backend)
    return kern(x, eps=eps)


def quantize_fp8_per_tensor(x: torch.Tensor, scale: torch.Tensor | None = None, *,
                            eps: float = 1e-10, backend: str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp8 scale for the whole tensor: dynamic (scale None: max(|x|, eps) / 448, computed
    on the device, no host sync) or static (scale: a 1-element float32 tensor on x's device).

    x: [R, K] fp32/fp16/bf16. Returns (q float8_e4m3fn [R, K], scale float32 0-d tensor).
    """
    _quant_input(x)
    _eps(eps)
    if scale is not None:
        _check.tensor("scale", scale, dtypes=(torch.float32,), device=x.device)
        if scale.numel() != 1:
            raise ValueError(f"scale: expected one element, got shape {tuple(scale.shape)}")
    kern = select("gemm", "quantize_fp8_per_tensor", device=x.device,
                  formats={"x": fmt(x.dtype)}, backend=backend)
    return kern(x, scale, eps=eps)
