"""The tskernels ops the models call, with the registry's choice bound once on the CPU.

On a GPU these are the public ops as they are (decode steps replay CUDA graphs, where per-call
validation and selection cost nothing). On the CPU a decode step makes ~300 op calls and the
public ops' per-call validation + selection (~10-20 us each) is a visible share of the step, so
each op asks the registry once per (dtypes, traits) for the kernel the public op would select,
describing the problem exactly as the public op does, then calls it with the public op's
calling convention. The models' shapes are validated once by the parity tests instead.
"""
from __future__ import annotations

import torch

import tskernels
from tskernels import fmt

_bound: dict[tuple, object] = {}
# The backend named for 16-bit GEMMs (the runner sets tskernels' opt-in "torch_native", which
# keeps bf16 operands bf16; the reference upcasts both to fp32 on every call). fp32 stays on
# the reference.
gemm_backend: str | None = None
# The backend named for fp32 / bf16 GEMMs on the CPU (the runner sets tskernels' opt-in
# "cpu_stream": weight-streaming kernel for decode rows, torch.mm for prefill).
gemm_backend_cpu: str | None = None
# The backend named for fp32 / bf16 norms / activation / RoPE on the CPU (the runner sets
# tskernels' opt-in "cpu_native" when its extension is built).
cpu_backend: str | None = None


def _cpu_backend(dtype: torch.dtype) -> str | None:
    return cpu_backend if dtype in (torch.float32, torch.bfloat16) else None


def _kernel(key: tuple, family: str, op: str, backend: str | None, problem):
    """The kernel bound for `key`; `problem()` (formats / traits) is only built on a miss."""
    k = _bound.get(key)
    if k is None:
        k = _bound[key] = tskernels.select(family, op, device="cpu", backend=backend, **problem())
    return k


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None):
    """c = a @ b.T, a [M, K], b [N, K] (gemm.mm)."""
    backend = gemm_backend if a.dtype in (torch.bfloat16, torch.float16) else None
    if a.device.type != "cpu":
        return tskernels.gemm.mm(a, b, out_dtype=out_dtype, backend=backend)
    if a.dtype in (torch.float32, torch.bfloat16) and b.dtype == a.dtype and gemm_backend_cpu:
        backend = gemm_backend_cpu
    c = out_dtype or a.dtype
    k = _kernel(("mm", a.dtype, b.dtype, c, backend), "gemm", "mm", backend,
                lambda: dict(formats={"a": fmt(a.dtype), "b": fmt(b.dtype), "c": fmt(c)}))
    return k(a, b, out_dtype=out_dtype)


def _norm_problem(x: torch.Tensor, weight: torch.Tensor) -> dict:
    return dict(formats={"x": fmt(x.dtype), "weight": fmt(weight.dtype)},
                traits={"hidden": x.shape[-1]})


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float):
    if x.device.type != "cpu":
        return tskernels.norm.rmsnorm(x, weight, eps)
    n = x.shape[-1]
    be = _cpu_backend(weight.dtype if x.dtype == weight.dtype else None)
    k = _kernel(("rmsnorm", x.dtype, weight.dtype, n, be), "norm", "rmsnorm", be,
                lambda: _norm_problem(x, weight))
    return k(x, weight, eps, out=None)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    if x.device.type != "cpu":
        return tskernels.norm.fused_add_rmsnorm(x, residual, weight, eps)
    n = x.shape[-1]
    be = _cpu_backend(weight.dtype if x.dtype == weight.dtype else None)
    k = _kernel(("fused_add_rmsnorm", x.dtype, weight.dtype, n, be), "norm",
                "fused_add_rmsnorm", be, lambda: _norm_problem(x, weight))
    return k(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor):
    if x.device.type != "cpu":
        return tskernels.activation.silu_and_mul(x)
    be = _cpu_backend(x.dtype)
    k = _kernel(("silu_and_mul", x.dtype, be), "activation", "silu_and_mul", be,
                lambda: dict(formats={"x": fmt(x.dtype)}))
    return k(x, out=None)


def apply_rope(q, k, positions, cos_sin_cache, *, style: str):
    if q.device.type != "cpu":
        return tskernels.rope.apply_rope(q, k, positions, cos_sin_cache, style=style)
    be = _cpu_backend(q.dtype)
    kern = _kernel(("apply_rope", q.dtype, style, be), "rope", "apply_rope", be,
                   lambda: dict(formats={"q": fmt(q.dtype)}, traits={"style": style}))
    return kern(q, k, positions, cos_sin_cache, style=style, inplace=False)
