"""Every public op takes the reference's arguments (names, order, kinds, defaults) plus a
keyword-only `backend=None`."""
from __future__ import annotations

import importlib
import inspect

import pytest

import tskernels

OPS = [("gemm", "mm"), ("gemm", "gemv"), ("gemm", "fp8_block_mm"),
       ("moe", "topk_softmax"), ("moe", "topk_sigmoid_grouped"), ("moe", "align_by_expert"),
       ("moe", "fused_experts"), ("moe", "combine"), ("sampling", "sample"),
       ("sampling", "greedy"), ("sampling", "apply_penalties"), ("gdn", "chunk_prefill"), ("gdn", "decode_step"),
       ("kvcache", "store_mla")]


def _params(fn) -> list[tuple]:
    return [(n, p.kind, p.default) for n, p in inspect.signature(fn).parameters.items()]


@pytest.mark.parametrize("family,op", OPS)
def test_public_signature_is_the_reference_plus_backend(family, op):
    public = getattr(getattr(tskernels, family), op)
    reference = getattr(importlib.import_module(f"tskernels_ref.{family}"), op)
    got = _params(public)
    assert got[-1] == ("backend", inspect.Parameter.KEYWORD_ONLY, None)
    assert got[:-1] == _params(reference)
    assert public.__doc__


@pytest.mark.parametrize("family,op", OPS)
def test_reference_backend_registered(family, op):
    assert "reference" in {k.backend for k in tskernels.kernels(family, op)}
