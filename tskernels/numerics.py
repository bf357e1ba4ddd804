"""The one place tolerances live.

Rule: compare a kernel's output against a float64 (or float32-for-fp8) ground truth by two
numbers, both relative to the reference's scale:
  rel_rms = ||out - ref||_2 / ||ref||_2            (overall accuracy)
  rel_max = max|out - ref| / max|ref|              (catches a single wrong row or page)
Each must be under the dtype's bound, or under `k` times the error of the same-precision PyTorch
reference on the same inputs (`baseline`), whichever is larger: a kernel may be as inexact as
eager PyTorch in its own precision, not more. NaN never passes: NaN positions must match.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    rel_rms: float
    rel_max: float
    k: float = 2.0


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-10, 1e-9),
    torch.float32: Tolerance(1e-5, 1e-4),
    torch.float16: Tolerance(2e-3, 1e-2),
    torch.bfloat16: Tolerance(1.2e-2, 4e-2),
    torch.float8_e4m3fn: Tolerance(8e-2, 0.25),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise ValueError(f"no tolerance defined for {dtype}") from None


@dataclass(frozen=True)
class ErrorStats:
    rel_rms: float
    rel_max: float
    worst_index: tuple[int, ...]

    def __str__(self) -> str:
        return f"rel_rms={self.rel_rms:.3e} rel_max={self.rel_max:.3e} at {self.worst_index}"


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    """Relative errors of `out` against `ref` over their finite entries (float64 math)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    finite = torch.isfinite(r)
    d = torch.where(finite, (o - r).abs(), torch.zeros_like(r))
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    rf = torch.where(finite, r, torch.zeros_like(r))
    scale_rms = rf.norm().item()
    scale_max = rf.abs().max().item() if rf.numel() else 0.0
    tiny = 1e-30
    worst = tuple(int(i) for i in torch.unravel_index(d.argmax(), d.shape)) if d.numel() else ()
    return ErrorStats(d.norm().item() / max(scale_rms, tiny),
                      (d.max().item() if d.numel() else 0.0) / max(scale_max, tiny), worst)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, *,
                 baseline: torch.Tensor | None = None, name: str = "output") -> ErrorStats:
    """Assert `out` matches the high-precision `ref` within the tolerance of `dtype` (default:
    out.dtype). `baseline`: the same-precision PyTorch result, whose error widens the bound to
    `k` times it. Returns the error statistics."""
    if out.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    tol = tolerance(dtype or out.dtype)
    o_nan, r_nan = torch.isnan(out.detach().cpu()), torch.isnan(ref.detach().cpu())
    if not torch.equal(o_nan, r_nan):
        idx = torch.nonzero(o_nan != r_nan)[:5].tolist()
        raise AssertionError(f"{name}: NaN pattern differs from the reference at {idx} "
                             f"({int(o_nan.sum())} NaN in output, {int(r_nan.sum())} in reference)")
    st = error_stats(out, ref)
    rms_bound, max_bound = tol.rel_rms, tol.rel_max
    if baseline is not None:
        b = error_stats(baseline, ref)
        rms_bound = max(rms_bound, tol.k * b.rel_rms)
        max_bound = max(max_bound, tol.k * b.rel_max)
    if not (st.rel_rms <= rms_bound and st.rel_max <= max_bound):
        raise AssertionError(f"{name}: {st} exceeds bounds rel_rms<={rms_bound:.1e}, "
                             f"rel_max<={max_bound:.1e} ({dtype or out.dtype})")
    return st
