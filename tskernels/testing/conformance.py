"""Registry-driven conformance: every registered (family, op, backend) against the reference.

An op declares how to draw valid problems for it once, with `@problem_generator(family, op)`
(the built-in generators are in `tskernels.testing.generators`); from then on every backend
registered for that op -- including one dropped into its family folder tomorrow -- is run on
those problems by tests/registry/test_conformance.py and compared with the reference under the
tolerance rule of `tskernels.numerics`, without a test of its own:

    @problem_generator("norm", "rmsnorm")
    def _rmsnorm(gen: torch.Generator, dtype: torch.dtype, size: str) -> Case:
        x = torch.randn(rows, hidden, generator=gen).to(dtype)
        ...
        return Case(args=(x, w, 1e-6), kwargs={}, formats={"x": fmt(dtype), ...})

A generator gets a seeded `torch.Generator`, the dtype under test and a size ("small": CPU and
the Triton interpreter; "large": the GPU tier) and returns a `Case`: the kernel's arguments in
the op's kernel calling convention (what the public op passes to the selected kernel), the
problem's formats / traits (a backend that does not claim them is not run on it), and which
result to compare (`outputs`). The ground truth is the reference kernel on float64 copies of
the floating-point inputs (fp8 tensors stay as they are), and the same-precision reference run
is the baseline that may widen the bound (`numerics.assert_close`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics import assert_close

SIZES = ("small", "large")


@dataclass
class Case:
    """One problem: `fn(*args, **kwargs)` for every backend. formats / traits: as the public op
    describes the problem to `select`. outputs(result, args): the tensors to compare (default:
    the result itself, or its tensors when it is a tuple); in-place ops return the buffers they
    wrote from `args`. tol_dtype: the dtype whose tolerance applies (default: the case dtype).
    label: what the problem is, for failure messages."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    traits: dict[str, Any] = field(default_factory=dict)
    outputs: Callable[[Any, tuple], Any] | None = None
    tol_dtype: torch.dtype | None = None
    label: str = ""


Generator = Callable[[torch.Generator, torch.dtype, str], Case]
_GENERATORS: dict[tuple[str, str], tuple[Generator, tuple[torch.dtype, ...]]] = {}


def problem_generator(family: str, op: str, *,
                      dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16,
                                                         torch.bfloat16)):
    """Declare the problem generator of `family.op` (one per op). dtypes: the input dtypes it
    can build problems for (each backend runs those its formats accept)."""
    def deco(fn: Generator) -> Generator:
        _GENERATORS[family, op] = (fn, tuple(dtypes))
        return fn
    return deco


def generators() -> dict[tuple[str, str], tuple[Generator, tuple[torch.dtype, ...]]]:
    """Every declared generator (importing the built-in ones first)."""
    from . import generators as _builtin  # noqa: F401  (declares them)
    return dict(_GENERATORS)


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _to64(x):
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.element_size() > 1:
            return x.to(torch.float64)
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []


def _outputs(case: Case, args: tuple, result) -> list[torch.Tensor]:
    got = case.outputs(result, args) if case.outputs is not None else result
    return _tensors(got)


def run_case(kernel, reference, case: Case, dtype: torch.dtype, device: str) -> None:
    """Run `kernel` (a KernelSpec or function) on `case` on `device` and assert every output
    is within the tolerance of `dtype` against the float64 reference (baseline: the
    same-precision reference)."""
    def on(dev, x):
        if isinstance(x, torch.Tensor):
            return x.to(dev)
        if isinstance(x, (tuple, list)):
            return type(x)(on(dev, v) for v in x)
        if isinstance(x, dict):
            return {k: on(dev, v) for k, v in x.items()}
        return x

    args64, kw64 = _to64(case.args), _to64(case.kwargs)
    truth = _outputs(case, args64, reference(*args64, **kw64))
    base_args, base_kw = _clone(case.args), _clone(case.kwargs)
    baseline = _outputs(case, base_args, reference(*base_args, **base_kw))
    args, kw = on(device, _clone(case.args)), on(device, _clone(case.kwargs))
    got = _outputs(case, args, kernel(*args, **kw))
    if len(got) != len(truth):
        raise AssertionError(f"{case.label}: {len(got)} outputs, the reference gives "
                             f"{len(truth)}")
    tol = case.tol_dtype or dtype
    for i, (g, t, b) in enumerate(zip(got, truth, baseline)):
        if not g.is_floating_point():
            if not torch.equal(g.cpu(), t.cpu()):
                raise AssertionError(f"{case.label}: output {i} differs from the reference")
            continue
        assert_close(g.cpu(), t.cpu(), tol, baseline=b.cpu(), name=f"{case.label} output {i}")
