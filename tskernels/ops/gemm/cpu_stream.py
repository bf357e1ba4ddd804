"""gemm.mm / gemm.gemv on the CPU for decode shapes ("cpu_stream"): fp32 or bf16, M <= 16.

A decode step's GEMMs have a handful of rows (one per running request) against weights that
come from DRAM; they are bound by how fast the weights stream. tskernels/csrc/cpu_gemm.cpp
reads every weight row once and multiplies it into all rows of `a` (AVX-512 when the CPU has
it, a portable loop otherwise), split over torch's OpenMP threads. On the 2-core dev box it
streams fp32 weights at ~25-29 GB/s at M=1 where torch.mm (MKL) reaches ~11-15
(`python benchmarks/cpu_gemm_probe.py`). Above 16 rows (prefill) `mm` hands over to torch.mm,
which is compute-bound there and good at it.

bf16 weights are widened to fp32 exactly as they are read (half the bytes of fp32), x is
widened once, the sums are fp32 and the result is rounded to bf16 once, like the reference.
CPU only, opt-in (never auto-selected: it sums in a different order than the reference);
engines name it, as serve's model runner does for fp32 and bf16 models on the CPU.
Run-verified on the CPU by tests/kernels/test_gemm_cpu_stream.py. Needs the compiled
`tskernels._cpu` extension (built by `pip install`); without it the backend is not registered.
"""
from __future__ import annotations

import torch

from ...registry import Capability, register

try:
    from ... import _cpu
except ImportError:  # a source checkout without the built extension
    _cpu = None

BACKEND = "cpu_stream"
MAX_M = 16
CPU_ONLY = Capability(vendors=frozenset({"cpu"}))


def available() -> bool:
    return _cpu is not None


def _small_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 c = a @ b.T; b float32 or bfloat16 (a is then widened to float32 first)."""
    if a.dtype != torch.float32:
        a = a.float()
    m, k = a.shape
    n = b.shape[0]
    if a.stride(-1) != 1 or (m > 1 and a.stride(0) < k):
        a = a.contiguous()
    if b.stride(-1) != 1 or (n > 1 and b.stride(0) < k):
        b = b.contiguous()
    c = torch.empty(m, n, dtype=torch.float32)
    fn = _cpu.gemm_f32 if b.dtype == torch.float32 else _cpu.gemm_bf16w
    fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, a.stride(0) if m > 1 else k,
       b.stride(0) if n > 1 else k, n)
    return c


def _convert(c: torch.Tensor, out_dtype) -> torch.Tensor:
    return c if out_dtype == c.dtype else c.to(out_dtype)


if _cpu is not None:
    _KW = dict(backend=BACKEND, capability=CPU_ONLY, band="portable", run_verified=("cpu",),
               opt_in=True, tags=("deterministic",),
               formats={"a": ("fp32", "bf16"), "b": ("fp32", "bf16"),
                        "c": ("fp32", "bf16", "fp64")})

    @register("gemm", "mm", **_KW)
    def mm(a, b, *, out_dtype=None):
        """c = a @ b.T: the weight-streaming kernel for M <= 16, torch.mm above."""
        if a.shape[0] > MAX_M:
            return _convert(torch.mm(a, b.t()), out_dtype or a.dtype)
        return _convert(_small_mm(a, b), out_dtype or a.dtype)

    @register("gemm", "gemv", **_KW)
    def gemv(a, b, *, out_dtype=None):
        """c = a @ b.T for M <= 16 with the weight-streaming kernel."""
        return _convert(_small_mm(a, b), out_dtype or a.dtype)
