"""gemm.mm / gemm.gemv / gemm.int8w_mm on the CPU for decode shapes ("cpu_stream"): fp32, bf16
or int8 (weight-only, per-row scales) weights, M <= 16.

A decode step's GEMMs have a handful of rows (one per running request) against weights that
come from DRAM; they are bound by how fast the weights stream. tskernels/csrc/cpu_gemm.cpp
reads every weight row once and multiplies it into all rows of `a`, split over torch's OpenMP
threads, with an AVX-512, an AVX2+FMA and a NEON path chosen per call by what the CPU has
(capped by TSKERNELS_CPU_ISA, see tskernels/platform.py). The capability says so: on a CPU with
none of them (only the slow portable loop would run) the backend is not selectable and the
registry (or an engine's policy) falls back to torch's own GEMM. On the 2-core dev box it
streams fp32 weights at ~25-29 GB/s at M=1 where torch.mm (MKL) reaches ~11-15
(`python benchmarks/cpu_gemm_probe.py`). Above 16 rows (prefill) `mm` hands over to torch.mm,
which is compute-bound there and good at it; the weight-only int8w_mm / q4w_mm run the kernel
16 rows per pass instead (see CHUNK_MAX_M).
The NEON paths are built for aarch64 with a cross compiler and run under qemu's user-mode
emulation against the portable loop (tests/kernels/cpu_kernels_harness.cpp via
tests/kernels/test_cpu_isa.py); no ARM machine has timed them.

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
# the SIMD levels cpu_gemm.cpp has a path for; without one of them it is not selected
CPU_SIMD = Capability(vendors=frozenset({"cpu"}),
                      any_features=(frozenset({"avx512f", "fma"}), frozenset({"avx2", "fma"}),
                                    frozenset({"neon"})))


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
    _KW = dict(backend=BACKEND, capability=CPU_SIMD, band="portable", run_verified=("cpu",),
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

    @register("gemm", "int8w_mm", backend=BACKEND, capability=CPU_SIMD, band="portable",
              run_verified=("cpu",), opt_in=True, tags=("deterministic",),
              formats={"a": ("fp32", "bf16"), "b": ("int8",), "c": ("fp32", "bf16")})
    def int8w_mm(a, q, scale, *, act_int8=False, out_dtype=None):
        """c = a @ (q * scale).T: int8 weights streamed packed, 16 rows of a per pass (with
        act_int8: integer dot products on int8 groups of a); float activations above
        CHUNK_MAX_M rows: dequantized into torch.mm."""
        out_dtype = out_dtype or a.dtype
        if a.shape[0] > MAX_M and not _chunk(a.shape[0], act_int8):
            w = q.to(torch.float32) * scale[:, None]
            return _convert(torch.mm(a.float(), w.t()), out_dtype)
        x = a if a.dtype == torch.float32 else a.float()
        if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) < x.shape[1]):
            x = x.contiguous()
        if q.stride(-1) != 1 or (q.shape[0] > 1 and q.stride(0) < q.shape[1]):
            q = q.contiguous()
        s = scale.contiguous()
        m, k = x.shape
        n = q.shape[0]
        c = torch.empty(m, n, dtype=torch.float32)
        lda, ldb = x.stride(0) if m > 1 else k, q.stride(0) if n > 1 else k
        for r, rows in _row_passes(m):
            _cpu.gemm_i8w(x[r:].data_ptr(), q.data_ptr(), s.data_ptr(), c[r:].data_ptr(), rows,
                          n, k, lda, ldb, n, act_int8=act_int8)
        return _convert(c, out_dtype)

    @register("gemm", "q4w_mm", backend=BACKEND, capability=CPU_SIMD, band="portable",
              run_verified=("cpu",), opt_in=True, tags=("deterministic",),
              formats={"a": ("fp32", "bf16"), "b": ("uint4",), "c": ("fp32", "bf16")})
    def q4w_mm(a, q, scale, mins, *, act_int8=False, out_dtype=None):
        """c = a @ W.T, 4-bit W (groups of 32) widened as streamed, 16 rows of a per pass
        (with act_int8: integer dot products on int8 groups of a); float activations above
        CHUNK_MAX_M rows: dequantized into torch.mm."""
        out_dtype = out_dtype or a.dtype
        if a.shape[0] > MAX_M and not _chunk(a.shape[0], act_int8):
            return _convert(torch.mm(a.float(), _dequant_q4(q, scale, mins).t()), out_dtype)
        x = a if a.dtype == torch.float32 else a.float()
        if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) < x.shape[1]):
            x = x.contiguous()
        if q.stride(-1) != 1 or (q.shape[0] > 1 and q.stride(0) < q.shape[1]):
            q = q.contiguous()
        s, mn = scale.contiguous(), mins.contiguous()
        m, k = x.shape
        n = q.shape[0]
        c = torch.empty(m, n, dtype=torch.float32)
        lda, ldb = x.stride(0) if m > 1 else k, q.stride(0) if n > 1 else k // 2
        for r, rows in _row_passes(m):
            _cpu.gemm_q4w(x[r:].data_ptr(), q.data_ptr(), s.data_ptr(), mn.data_ptr(),
                          c[r:].data_ptr(), rows, n, k, lda, ldb, n, act_int8=act_int8)
        return _convert(c, out_dtype)


# Prefill rows of the weight-only GEMMs: 16 rows per pass of the decode-row kernel beat
# dequantizing the weight for torch.mm at every M measured (2 threads, AVX-512, one SmolLM2 layer:
# 4-bit x int8 M=32 1.19 vs 5.58 ms, M=256 9.87 vs 18.94; float activations M=256 14.2 vs
# 15.9; benchmarks/RESULTS.md, issue 22), and decode and prefill then compute the same formula
# the same way. Integer activations always; float activations up to CHUNK_MAX_M rows.
CHUNK_MAX_M = 256


def _chunk(m: int, act_int8: bool) -> bool:
    return act_int8 or m <= CHUNK_MAX_M


def _row_passes(m: int):
    """(first row, rows) of each kernel call over m rows of a: 16 per weight pass (one empty
    call for m = 0, which the kernel returns from at once)."""
    return [(r, min(MAX_M, m - r)) for r in range(0, max(m, 1), MAX_M)]


def fits_decode_rows(a: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether a call with activations `a` and output `out_dtype` may take `decode_rows`."""
    return a.dtype == torch.float32 and out_dtype == torch.float32 and a.dim() == 2 \
        and a.shape[0] <= MAX_M and a.is_contiguous()


def decode_rows(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                mins: torch.Tensor | None, act_int8: bool) -> torch.Tensor:
    """The registered q4w_mm (mins given) / int8w_mm (mins None) for float32 c without their
    per-call layout handling: a float32 [M <= 16, K] contiguous, q / scale / mins contiguous as
    the quantizers return them (the caller guarantees both: serve's quantized Linears, which
    make ~120 such calls per decode step, where the general wrapper's stride checks were ~4 us
    of each)."""
    m, k = a.shape
    n = q.shape[0]
    c = torch.empty(m, n, dtype=torch.float32)
    if mins is None:
        _cpu.gemm_i8w(a.data_ptr(), q.data_ptr(), scale.data_ptr(), c.data_ptr(), m, n, k, k, k,
                      n, act_int8=act_int8)
    else:
        _cpu.gemm_q4w(a.data_ptr(), q.data_ptr(), scale.data_ptr(), mins.data_ptr(),
                      c.data_ptr(), m, n, k, k, k // 2, n, act_int8=act_int8)
    return c


if _cpu is not None:
    # The lean entry of an engine's quantized Linears, reached through the selected kernel
    # (`tskernels.select(...).fn.decode_rows` / `.fits`), never by importing this module.
    int8w_mm.decode_rows = lambda a, q, scale, act_int8: decode_rows(a, q, scale, None,
                                                                      act_int8)
    q4w_mm.decode_rows = decode_rows
    int8w_mm.fits = q4w_mm.fits = fits_decode_rows


def _dequant_q4(q: torch.Tensor, scale: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """float32 W [N, K] from the packed 4-bit layout (see gemm.q4w_mm)."""
    n, half = q.shape
    g = q.view(n, half // 16, 16)
    nib = torch.cat([g & 15, g >> 4], dim=2).to(torch.float32)
    return (nib * scale[..., None] + mins[..., None]).reshape(n, 2 * half)
