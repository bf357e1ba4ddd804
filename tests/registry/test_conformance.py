"""Every registered (family, op, backend) that can run here, on its op's generated problems,
against the reference under the tolerance rule (tskernels.numerics).

Driven by the registry: a new backend file registered with `@register` is picked up with no
edit here; a new op adds its problem generator (tskernels/testing/generators.py, see
CONTRIBUTING.md). CPU: references and C++ backends natively, Triton backends under the
interpreter (fp32 / fp16: bf16 is not exact there), "small" problems, a few seeds. GPU tier
(`-m gpu` on a CUDA machine): the CUDA / Triton backends on "large" problems, more seeds.
Ops without a generator and backends that cannot run on this machine are skipped with the
reason in the test output (pytest -ra).
"""
from __future__ import annotations

import os

import pytest
import torch

import tskernels
from tskernels.platform import platform_of
from tskernels.testing.conformance import generators, run_case

from ..conftest import HAS_CUDA

GENERATORS = generators()
SIZE = "large" if HAS_CUDA else "small"
SEEDS = range(int(os.environ.get("TSKERNELS_CONFORMANCE_SEEDS", 6 if HAS_CUDA else 2)))


def _params():
    """Every registered non-reference kernel (plugins' included)."""
    return [pytest.param(k.family, k.op, k.backend, id=k.name) for k in tskernels.kernels()
            if k.band != "reference"]


def _reference(family, op):
    return next(k for k in tskernels.kernels(family, op) if k.backend == "reference")


def _interpreted(spec, device) -> bool:
    p = platform_of(device)
    return p.interpreter and spec.capability.interpretable and \
        "cpu" not in spec.capability.vendors


@pytest.mark.parametrize("family,op,backend", _params())
@pytest.mark.parametrize("seed", SEEDS)
def test_backend_matches_reference(family, op, backend, seed, kernel_device):
    if (family, op) not in GENERATORS:
        pytest.skip(f"{family}.{op}: no problem generator yet (add one in "
                    "tskernels/testing/generators.py)")
    spec = next(k for k in tskernels.kernels(family, op) if k.backend == backend)
    if not tskernels.available(family, op, backend, device=kernel_device):
        pytest.skip(f"{spec.name}: cannot run on {platform_of(kernel_device).target} here")
    gen_fn, dtypes = GENERATORS[family, op]
    if _interpreted(spec, kernel_device):
        dtypes = tuple(d for d in dtypes if d != torch.bfloat16)
    ran = []
    for dtype in dtypes:
        gen = torch.Generator().manual_seed(1000 * seed + dtypes.index(dtype))
        case = gen_fn(gen, dtype, SIZE)
        if not tskernels.available(family, op, backend, device=kernel_device,
                                   formats=case.formats, traits=case.traits):
            continue  # a problem outside what the backend claims (formats / traits)
        run_case(spec, _reference(family, op), case, dtype, kernel_device)
        ran.append(dtype)
    if not ran:
        pytest.skip(f"{spec.name}: claims none of the generated problems (dtypes "
                    f"{[str(d) for d in dtypes]}, seed {seed})")


@pytest.mark.parametrize("family,op", sorted(GENERATORS))
def test_generator_problems_run_on_the_reference(family, op):
    """Each generator's problems are valid: the reference (the ground truth) runs them."""
    gen_fn, dtypes = GENERATORS[family, op]
    for dtype in dtypes:
        case = gen_fn(torch.Generator().manual_seed(0), dtype, "small")
        run_case(_reference(family, op), _reference(family, op), case, dtype, "cpu")


def test_every_op_with_a_generator_is_registered():
    ops = {(k.family, k.op) for k in tskernels.kernels()}
    assert set(GENERATORS) <= ops, sorted(set(GENERATORS) - ops)
