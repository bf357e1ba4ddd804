"""Triton silu_and_mul: a 2-D grid of (row, column block); each program reads BLOCK gate and
BLOCK up elements and writes BLOCK outputs. Memory-bound: 3 * I elements move per row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning
from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared import pdl


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, I, x_stride, y_stride, BLOCK: tl.constexpr):
    """y[r, c] = silu(x[r, c]) * x[r, I + c], computed in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + I + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_tanh_and_mul_kernel(x_ptr, y_ptr, I, x_stride, y_stride, BLOCK: tl.constexpr):
    """y[r, c] = gelu_tanh(x[r, c]) * x[r, I + c] in fp32, using 0.5 (1 + tanh(u)) =
    sigmoid(2u): one exp, and no inf - inf for large |g|."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + I + cols, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    y = g / (1.0 + tl.exp(-2.0 * inner)) * u
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_chained_kernel(x_ptr, y_ptr, I, x_stride, y_stride, BLOCK: tl.constexpr,
                                 PDL: tl.constexpr):
    """_silu_and_mul_kernel chained (shared/pdl.py): the down projection's gemv may launch
    at once and stream its weights while this waits for the gate|up rows and runs. The tuned
    tables key on the plain kernel's source, which this wrapper leaves as it is."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    _silu_and_mul_kernel(x_ptr, y_ptr, I, x_stride, y_stride, BLOCK)


@triton.jit
def _gelu_tanh_and_mul_chained_kernel(x_ptr, y_ptr, I, x_stride, y_stride,
                                      BLOCK: tl.constexpr, PDL: tl.constexpr):
    """_gelu_tanh_and_mul_kernel chained, as _silu_and_mul_chained_kernel."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    _gelu_tanh_and_mul_kernel(x_ptr, y_ptr, I, x_stride, y_stride, BLOCK)


_CHAINED = {_silu_and_mul_kernel: _silu_and_mul_chained_kernel,
            _gelu_tanh_and_mul_kernel: _gelu_tanh_and_mul_chained_kernel}


def _block(I: int) -> int:
    return min(2048, triton.next_power_of_2(max(I, 16)))


_SIG = {"x_ptr": "*bf16", "y_ptr": "*bf16", "I": "i32", "x_stride": "i32", "y_stride": "i32"}


def _cases():
    return [CompileCase(_silu_and_mul_kernel, _SIG, {"BLOCK": 2048}, num_warps=8),
            CompileCase(_silu_and_mul_chained_kernel, _SIG, {"BLOCK": 2048, "PDL": True},
                        num_warps=8, targets=pdl.TARGETS)]


def _gelu_cases():
    return [CompileCase(_gelu_tanh_and_mul_kernel, _SIG, {"BLOCK": 2048}, num_warps=8),
            CompileCase(_gelu_tanh_and_mul_chained_kernel, _SIG, {"BLOCK": 2048, "PDL": True},
                        num_warps=8, targets=pdl.TARGETS)]


@register("activation", "silu_and_mul", **TRITON, formats={"x": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_cases)
def silu_and_mul(x, out=None):
    """Triton SiLU(gate) * up."""
    return _launch(_silu_and_mul_kernel, x, out)


@register("activation", "gelu_tanh_and_mul", **TRITON, formats={"x": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_gelu_cases)
def gelu_tanh_and_mul(x, out=None):
    """Triton GELU-tanh(gate) * up."""
    return _launch(_gelu_tanh_and_mul_kernel, x, out)


def _heuristic(p) -> dict:
    block = _block(p["I"])
    return {"block": block, "num_warps": max(1, min(8, block // 256))}


def _prune(cfg, p, target) -> str | None:
    if cfg["num_warps"] * target.warp_size > cfg["block"]:
        return "more threads than elements per program"
    if cfg["block"] > 2 * triton.next_power_of_2(max(p["I"], 16)):
        return "block wider than twice the row"
    return None


def _space(name, kernel):
    def runner(p, device):
        dt = getattr(torch, p.get("dtype", "bfloat16"))
        act = torch.nn.functional.silu if kernel is _silu_and_mul_kernel else (
            lambda g: torch.nn.functional.gelu(g, approximate="tanh"))
        make = lambda d: (torch.randn(p["rows"], 2 * p["I"], device=d, dtype=dt),)  # noqa: E731
        ref = lambda x: act(x[0][:, :p["I"]].double()) * x[0][:, p["I"]:].double()  # noqa: E731
        return tuning.TensorRunner(make, lambda cfg, x: _launch(kernel, x[0], None, cfg), ref, device)
    return declare(KernelSpace(
        name, Space(block=[256, 512, 1024, 2048, 4096], num_warps=[1, 2, 4, 8, 16]),
        key=lambda p: {"I": pow2_bucket(p["I"]), "rows": tuning.rows_bucket(p["rows"]),
                       "dtype": p.get("dtype", "bfloat16")},
        heuristic=_heuristic, prune=_prune, source=lambda: jit_source(kernel), runner=runner,
        parse=tuning.parse_shape, example={"I": 14336, "rows": 64, "dtype": "bfloat16"}))


SILU_SPACE = _space("activation.silu_and_mul.triton", _silu_and_mul_kernel)
GELU_SPACE = _space("activation.gelu_tanh_and_mul.triton", _gelu_tanh_and_mul_kernel)
_SPACES = {_silu_and_mul_kernel: SILU_SPACE, _gelu_tanh_and_mul_kernel: GELU_SPACE}


def _launch(kernel, x, out, cfg: dict | None = None):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    y = out if out is not None else torch.empty(*x.shape[:-1], I, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or I == 0:
        return y
    y2 = y.view(-1, I)
    if cfg is None:
        cfg = tuning.config(_SPACES[kernel], {"I": I, "rows": rows,
                                              "dtype": tuning.dtype_name(x.dtype)}, x.device)
    block = cfg["block"]
    extra = {}
    if pdl.chained("act_and_mul"):
        kernel, extra = _CHAINED[kernel], pdl.launch_args(x.device)
    kernel[(rows, triton.cdiv(I, block))](
        x2, y2, I, x2.stride(0), y2.stride(0), BLOCK=block, num_warps=cfg["num_warps"], **extra)
    return y
