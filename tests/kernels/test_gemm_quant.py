"""Triton fp8 quantizers vs the reference (interpreter on CPU, the GPU with -m gpu).

The kernels divide IEEE-exactly (div_rn). On CUDA, torch divides a tensor by a Python scalar
as a multiply by its reciprocal, so the reference's scale (amax / 448) can be one fp32 ulp off
the exact quotient there: scales are compared to 1 ulp, and the e4m3 codes exactly against
x / scale computed by torch from the kernel's own scales (a tensor / tensor division, IEEE on
both devices). The fused SiLU-and-mul within one e4m3 step (its exp is the hardware's)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close

gemm = tskernels.gemm
ON_GPU = torch.cuda.is_available()
IN_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])


def _x(m, k, dtype, device, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * scale
    if m and k:
        x[0, 0] = 0.0
    return x.to(device, dtype)


def _codes_from(x: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale_full).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _scales_close(s: torch.Tensor, rs: torch.Tensor) -> None:
    torch.testing.assert_close(s, rs, rtol=1.2e-7, atol=0)


def _same_fp8(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.float8_e4m3fn and got.shape == want.shape
    bad = got.view(torch.uint8) != want.view(torch.uint8)
    assert not bad.any(), f"{int(bad.sum())} codes differ, first at {bad.nonzero()[:3].tolist()}"


@settings(max_examples=10 if not ON_GPU else 16, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 700), group=st.sampled_from([16, 64, 128]),
       dtype=st.sampled_from(IN_DTYPES), seed=st.integers(0, 2**31 - 1))
def test_per_token_group(kernel_device, m, k, group, dtype, seed):
    x = _x(m, k, dtype, kernel_device, seed)
    q, s = gemm.quantize_fp8_per_token_group(x, group, backend="triton")
    rq, rs = ref.quantize_fp8_per_token_group(x, group)
    _scales_close(s, rs)
    _same_fp8(q, _codes_from(x, s.repeat_interleave(group, 1)[:, :k]))
    if kernel_device == "cpu":
        _same_fp8(q, rq)


def test_per_token_group_zero_rows_use_eps(kernel_device):
    x = torch.zeros(3, 256, device=kernel_device)
    q, s = gemm.quantize_fp8_per_token_group(x, backend="triton")
    assert torch.all(s == 1e-10 / 448.0) and torch.all(q.float() == 0)


@settings(max_examples=8 if not ON_GPU else 15, deadline=None)
@given(m=st.integers(1, 24), i=st.integers(1, 400), group=st.sampled_from([64, 128]),
       dtype=st.sampled_from(IN_DTYPES), seed=st.integers(0, 2**31 - 1))
def test_silu_and_mul_quantize(kernel_device, m, i, group, dtype, seed):
    x = _x(m, 2 * i, dtype, kernel_device, seed, scale=2.0)
    q, s = gemm.silu_and_mul_quantize_fp8(x, group, backend="triton")
    rq, rs = ref.silu_and_mul_quantize_fp8(x, group)
    torch.testing.assert_close(s, rs, rtol=2e-6, atol=0)  # exp rounding, then 1 ulp
    # dequantized: one e4m3 step (2^-3 relative) at most, where the exp rounds differently
    deq = q.float() * s.repeat_interleave(group, 1)[:, :i]
    rdeq = rq.float() * rs.repeat_interleave(group, 1)[:, :i]
    step = rdeq.abs() * 2.0 ** -3 + rs.repeat_interleave(group, 1)[:, :i] * 2.0 ** -9
    assert torch.all((deq - rdeq).abs() <= step + 1e-30)
    # and the dequantized values are the float64 product within fp8's tolerance
    g, u = x[:, :i].double(), x[:, i:].double()
    assert_close(deq, torch.nn.functional.silu(g) * u, dtype=torch.float8_e4m3fn)


@settings(max_examples=8 if not ON_GPU else 15, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 1500), dtype=st.sampled_from(IN_DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_per_channel(kernel_device, m, k, dtype, seed):
    x = _x(m, k, dtype, kernel_device, seed)
    q, s = gemm.quantize_fp8_per_channel(x, backend="triton")
    rq, rs = ref.quantize_fp8_per_channel(x)
    assert s.shape == (m, 1)
    _scales_close(s, rs)
    _same_fp8(q, _codes_from(x, s))
    if kernel_device == "cpu":
        _same_fp8(q, rq)


@settings(max_examples=8 if not ON_GPU else 15, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 1500), dtype=st.sampled_from(IN_DTYPES),
       static=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_per_tensor(kernel_device, m, k, dtype, static, seed):
    x = _x(m, k, dtype, kernel_device, seed)
    scale = torch.tensor([0.013], device=kernel_device) if static else None
    q, s = gemm.quantize_fp8_per_tensor(x, scale, backend="triton")
    rq, rs = ref.quantize_fp8_per_tensor(x, scale)
    assert s.shape == ()
    _scales_close(s, rs)
    _same_fp8(q, _codes_from(x, s))
    if kernel_device == "cpu":
        _same_fp8(q, rq)


@pytest.mark.parametrize("op", ["quantize_fp8_per_token_group", "silu_and_mul_quantize_fp8"])
def test_group_trait_limits_the_triton_kernel(kernel_device, op):
    x = torch.randn(2, 96, device=kernel_device)
    with pytest.raises(tskernels.SelectionError, match="trait group=48"):
        getattr(gemm, op)(x, 48, backend="triton")
    # the reference takes any group size
    getattr(gemm, op)(x, 48, backend="reference")
