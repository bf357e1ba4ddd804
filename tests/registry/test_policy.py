"""Kernel policies (soft backend preferences), `available`, and the typed cache kinds."""
from __future__ import annotations

import pytest
import torch

import tskernels
from tskernels import GQACacheSpec, KernelPolicy, MLACacheSpec

F16 = {"a": "fp16", "b": "fp16", "c": "fp16"}
F32 = {"a": "fp32", "b": "fp32", "c": "fp32"}


def test_policy_prefers_first_backend_that_runs():
    pol = KernelPolicy({"gemm.mm": ("no_such_backend", "torch_native")})
    with tskernels.use_backend(pol):
        assert tskernels.select("gemm", "mm", device="cpu", formats=F16).backend == \
            "torch_native"
        # an op without a preference keeps the registry's choice
        assert tskernels.select("gemm", "gemv", device="cpu", formats=F16).backend == \
            "reference"
        assert tskernels.active_policy() is pol
    assert tskernels.active_policy() is None
    assert tskernels.select("gemm", "mm", device="cpu", formats=F16).backend == "reference"


def test_policy_falls_back_where_preference_cannot_run():
    # torch_cpu takes no fp8 cache: the policy passes it over instead of raising
    pol = KernelPolicy({"attention": "torch_cpu"})
    with tskernels.use_backend(pol):
        k = tskernels.select("attention", "store_kv", device="cpu",
                             formats={"k": "fp32", "kv": "fp8_e4m3:per_tensor"},
                             traits={"head_dim": 64})
        assert k.backend == "reference"
        text = tskernels.explain("attention", "store_kv", device="cpu",
                                 formats={"k": "fp32", "kv": "fp8_e4m3:per_tensor"},
                                 traits={"head_dim": 64}, file=False)
        assert "passed over by KernelPolicy" in text


def test_explicit_backend_beats_policy():
    pol = KernelPolicy({"gemm.mm": "torch_native"})
    with tskernels.use_backend(pol):
        assert tskernels.select("gemm", "mm", device="cpu", formats=F32,
                                backend="reference").backend == "reference"
        with tskernels.use_backend({"gemm.mm": "reference"}):
            assert tskernels.select("gemm", "mm", device="cpu", formats=F32).backend == \
                "reference"


def test_enclosing_override_beats_an_inner_policy(monkeypatch):
    """An engine enters its policy inside a user's `use_backend` / TSKERNELS_BACKEND choice:
    the user's explicit choice still wins (the H200 serving tier caught the opposite)."""
    pol = KernelPolicy({"gemm.mm": "torch_native"})
    with tskernels.use_backend({"gemm.mm": "reference"}):
        with tskernels.use_backend(pol):
            assert tskernels.select("gemm", "mm", device="cpu", formats=F16).backend == \
                "reference"
    monkeypatch.setenv("TSKERNELS_BACKEND", "gemm.mm=reference")
    with tskernels.use_backend(pol):
        assert tskernels.select("gemm", "mm", device="cpu", formats=F16).backend == "reference"
    monkeypatch.delenv("TSKERNELS_BACKEND")
    with tskernels.use_backend(pol):
        assert tskernels.select("gemm", "mm", device="cpu", formats=F16).backend == \
            "torch_native"


def test_policy_validates_and_reprs():
    with pytest.raises(TypeError, match="prefer"):
        KernelPolicy({"gemm.mm": ()})
    assert "gemm.mm=a>b" in repr(KernelPolicy({"gemm.mm": ("a", "b")}))


def test_available():
    assert tskernels.available("gemm", "mm", "reference", device="cpu")
    assert tskernels.available("gemm", "mm", "torch_native", device="cpu",
                               formats={"a": "fp16"})
    assert not tskernels.available("gemm", "mm", "no_such_backend", device="cpu")
    assert not tskernels.available("attention", "store_kv", "torch_cpu", device="cpu",
                                   formats={"kv": "fp8_e4m3:per_tensor"})


def test_cache_specs():
    g = GQACacheSpec(num_layers=2, num_kv_heads=4, head_dim=64)
    assert g.bytes_per_token(torch.bfloat16) == 2 * 2 * 4 * 64 * 2
    k, v = g.allocate(3, 16, torch.float32, "cpu")
    assert k.shape == v.shape == (2, 3, 16, 4, 64)
    m = MLACacheSpec(num_layers=3, kv_lora_rank=32, rope_dim=8)
    assert m.width == 40 and m.bytes_per_token(torch.float8_e4m3fn) == 3 * 40
    (kv,) = m.allocate(2, 4, torch.bfloat16, "cpu")
    assert kv.shape == (3, 2, 4, 40)
    with pytest.raises(ValueError, match="num_kv_heads"):
        GQACacheSpec(num_layers=1, num_kv_heads=0)
    with pytest.raises(ValueError, match="sliding_window"):
        GQACacheSpec(num_layers=1, sliding_window=-1)
