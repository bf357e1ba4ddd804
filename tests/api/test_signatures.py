"""Every public op takes the reference's arguments (names, order, kinds, defaults) plus a
keyword-only `backend=None`."""
from __future__ import annotations

import importlib
import inspect

import pytest

import tskernels

# Every registered op with a reference backend (new ops are covered with no edit here).
OPS = sorted({(k.family, k.op) for k in tskernels.kernels() if k.backend == "reference"})

# Where a public op deliberately differs from its reference: (parameters only the public op
# has, parameters only the reference has). Keep this short; each entry says why.
DIFFERENCES = {
    # caller-owned output buffers
    ("activation", "silu_and_mul"): ({"out"}, set()),
    ("activation", "gelu_tanh_and_mul"): ({"out"}, set()),
    ("norm", "rmsnorm"): ({"out"}, set()),
    # the reference also returns the lse for the split-KV tests; extend may read the new
    # tokens' own K/V contiguously
    ("attention", "decode"): (set(), {"return_lse"}),
    ("attention", "extend"): ({"k", "v"}, {"return_lse"}),
    # in-place variant; the rotary width is the cache's width in the public op
    ("rope", "apply_rope"): ({"inplace"}, {"rotary_dim"}),
}
# the public op takes the scales keyword-only (the reference also positionally)
KINDS_DIFFER = {("attention", "store_kv")}


def _params(fn) -> list[tuple]:
    return [(n, p.kind, p.default) for n, p in inspect.signature(fn).parameters.items()]


@pytest.mark.parametrize("family,op", OPS)
def test_public_signature_is_the_reference_plus_backend(family, op):
    public = getattr(getattr(tskernels, family), op)
    reference = getattr(importlib.import_module(f"tskernels_ref.{family}"), op)
    got = _params(public)
    assert got[-1] == ("backend", inspect.Parameter.KEYWORD_ONLY, None)
    only_public, only_ref = DIFFERENCES.get((family, op), (set(), set()))
    def strip(ps):
        return [(n, d) for n, _, d in ps] if (family, op) in KINDS_DIFFER else ps
    assert strip([p for p in got[:-1] if p[0] not in only_public]) == \
        strip([p for p in _params(reference) if p[0] not in only_ref])
    assert public.__doc__


def test_families_are_one_list():
    import tskernels_ref
    assert tskernels.FAMILIES == tskernels_ref.FAMILIES
    assert {k.family for k in tskernels.kernels()} <= set(tskernels.FAMILIES)


@pytest.mark.parametrize("family,op", OPS)
def test_reference_backend_registered(family, op):
    assert "reference" in {k.backend for k in tskernels.kernels(family, op)}


def test_store_kv_old_keyword_still_works_with_a_warning():
    import torch
    k = torch.randn(2, 1, 16)
    kc, vc = torch.zeros(4, 4, 1, 16), torch.zeros(4, 4, 1, 16)
    with pytest.warns(DeprecationWarning, match="'v_' is deprecated"):
        tskernels.attention.store_kv(k, v_=2 * k, k_cache=kc, v_cache=vc,
                                     slot_mapping=torch.tensor([5, 6]))
    assert torch.equal(vc.view(-1, 1, 16)[[5, 6]], 2 * k)
