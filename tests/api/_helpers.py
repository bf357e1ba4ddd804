"""Shared checks of the public-API tests: exact equality with the reference, selection."""
from __future__ import annotations

import torch

import tskernels


def assert_same(got, want) -> None:
    """Bit-for-bit equality of tensors (fp8 compared through its bytes), tuples of them, or
    dataclasses of them (SampleOutput)."""
    if hasattr(want, "__dataclass_fields__"):
        for name in want.__dataclass_fields__:
            assert_same(getattr(got, name), getattr(want, name))
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif want is None:
        assert got is None
    else:
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        if want.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            got, want = got.view(torch.uint8), want.view(torch.uint8)
        assert torch.equal(got, want), (got, want)


def assert_reference_selected(family: str, op: str, **problem) -> None:
    kern = tskernels.select(family, op, device="cpu", **problem)
    assert kern.backend == "reference", tskernels.explain(family, op, device="cpu", **problem,
                                                          file=False)
