"""silu_and_mul kernel vs the float64 reference."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.activation as ref
from tskernels.numerics import assert_close
from tskernels.testing.problems import poisoned_like


@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([0, 1, 3, 17]), inter=st.integers(1, 2100),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       scale=st.sampled_from([0.1, 1.0, 8.0]))
def test_silu_and_mul_triton(kernel_device, seed, rows, inter, dtype, scale):
    torch.manual_seed(seed)
    x = (torch.randn(rows, 2 * inter) * scale).to(kernel_device, dtype)
    out = poisoned_like(x[:, :inter])
    y = tskernels.activation.silu_and_mul(x, out=out, backend="triton")
    assert y.data_ptr() == out.data_ptr()
    assert_close(y, ref.silu_and_mul(x.double()), baseline=ref.silu_and_mul(x))


def test_silu_and_mul_3d(kernel_device):
    x = torch.randn(2, 3, 40, device=kernel_device)
    assert_close(tskernels.activation.silu_and_mul(x, backend="triton"),
                 ref.silu_and_mul(x.double()))


def test_silu_and_mul_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        tskernels.activation.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="out"):
        tskernels.activation.silu_and_mul(torch.randn(2, 8), out=torch.empty(2, 3))


# ---- gelu_tanh_and_mul (GeGLU, tanh approximation) -------------------------------------------
@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([0, 1, 5]), inter=st.integers(1, 600),
       dtype=st.sampled_from([torch.float32, torch.float16]),
       scale=st.sampled_from([0.1, 1.0, 8.0]))
def test_gelu_tanh_and_mul_triton(kernel_device, seed, rows, inter, dtype, scale):
    torch.manual_seed(seed)
    x = (torch.randn(rows, 2 * inter) * scale).to(kernel_device, dtype)
    out = poisoned_like(x[:, :inter])
    y = tskernels.activation.gelu_tanh_and_mul(x, out=out, backend="triton")
    assert y.data_ptr() == out.data_ptr()
    assert_close(y, ref.gelu_tanh_and_mul(x.double()), baseline=ref.gelu_tanh_and_mul(x))


def test_gelu_tanh_reference_is_torch_tanh_gelu_in_float64():
    x = torch.randn(3, 64, dtype=torch.float64) * 4
    g, u = x[:, :32], x[:, 32:]
    want = 0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g ** 3))) * u
    torch.testing.assert_close(ref.gelu_tanh_and_mul(x), want, rtol=1e-12, atol=1e-12)
    # the public op on the CPU, 3-D, and its input check
    y = tskernels.activation.gelu_tanh_and_mul(x.float().view(3, 1, 64))
    torch.testing.assert_close(y.view(3, 32).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        tskernels.activation.gelu_tanh_and_mul(torch.randn(2, 7))


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
def test_chained_launches_match_the_reference(kernel_device, monkeypatch, op):
    """The chained wrappers (shared/pdl.CHAIN "act_and_mul") give the plain kernels' results."""
    from tskernels.ops.shared import pdl
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"act_and_mul"}))
    x = torch.randn(3, 2 * 300).to(kernel_device, torch.float16)
    out = poisoned_like(x[:, :300])
    y = getattr(tskernels.activation, op)(x, out=out, backend="triton")
    assert_close(y, getattr(ref, op)(x.double()), baseline=getattr(ref, op)(x))
