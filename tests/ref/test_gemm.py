"""tskernels_ref.gemm vs naive float64 dot products and element-wise (de)quantization."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tskernels_ref import gemm
from tskernels_ref._common import FP8_DTYPE

from ._problems import rand


def naive_mm(a, b):
    """c[m, n] = sum_k a[m, k] b[n, k], one dot product at a time, float64."""
    c = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for m in range(a.shape[0]):
        for n in range(b.shape[0]):
            c[m, n] = (a[m].double() * b[n].double()).sum()
    return c


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 24), n=st.integers(1, 24), k=st.integers(1, 80),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), seed=st.integers(0, 2**31))
def test_mm_and_gemv(m, n, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = rand(m, k, gen=gen).to(dtype), rand(n, k, gen=gen).to(dtype)
    want = naive_mm(a, b)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-12}[dtype]
    c = gemm.mm(a, b)
    assert c.dtype == dtype
    torch.testing.assert_close(c.double(), want, rtol=tol, atol=tol * k ** 0.5)
    c32 = gemm.mm(a, b, out_dtype=torch.float32)
    assert c32.dtype == torch.float32
    if dtype != torch.float64:
        torch.testing.assert_close(c32.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)
    torch.testing.assert_close(gemm.gemv(a[:16], b), c[:16])


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 300), k=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_fp8_block_mm(m, n, k, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = rand(m, k, gen=gen, scale=4.0), rand(n, k, gen=gen, scale=0.05)
    aq, a_scale = gemm.quantize_fp8_per_token_group(x.float())
    bq, b_scale = gemm.quantize_fp8_block(w.float())
    assert aq.dtype == bq.dtype == FP8_DTYPE
    assert a_scale.shape == (m, -(-k // 128)) and b_scale.shape == (-(-n // 128), -(-k // 128))
    # element-wise dequantization, then a naive product
    a_deq = torch.empty(m, k, dtype=torch.float64)
    b_deq = torch.empty(n, k, dtype=torch.float64)
    for i in range(m):
        for j in range(k):
            a_deq[i, j] = float(aq[i, j].float()) * float(a_scale[i, j // 128])
    for i in range(n):
        for j in range(k):
            b_deq[i, j] = float(bq[i, j].float()) * float(b_scale[i // 128, j // 128])
    # the quantizers: per-group amax maps to 448, and round-trip error is within e4m3 precision
    for i in range(m):
        for g in range(a_scale.shape[1]):
            amax = x[i, g * 128 : (g + 1) * 128].abs().max()
            torch.testing.assert_close(a_scale[i, g].double(), amax.float().double() / 448, rtol=1e-6, atol=1e-12)
    # e4m3: 3 mantissa bits (rel. error <= 2^-4), subnormal step 2^-9 (in units of the scale)
    a_step = a_scale.double().repeat_interleave(128, 1)[:, :k] * 2**-10
    b_step = b_scale.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k] * 2**-10
    assert ((a_deq - x.float().double()).abs() <= x.abs() * 2**-4 + a_step + 1e-12).all()
    assert ((b_deq - w.float().double()).abs() <= w.abs() * 2**-4 + b_step + 1e-12).all()
    want = naive_mm(a_deq, b_deq)
    c = gemm.fp8_block_mm(aq, a_scale, bq, b_scale, out_dtype=torch.float32)
    torch.testing.assert_close(c.double(), want, rtol=1e-5, atol=1e-5)
    c16 = gemm.fp8_block_mm(aq, a_scale, bq, b_scale)
    assert c16.dtype == torch.bfloat16
    torch.testing.assert_close(c16.double(), want, rtol=1e-2, atol=1e-2)
