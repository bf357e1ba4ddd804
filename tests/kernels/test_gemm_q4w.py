"""gemm.q4w_mm (weight-only 4-bit, groups of 32 along K) and gemm.quantize_q4_groups: the
quantizer's error bound and packing, the reference and the C++ kernel on every SIMD path
(AVX-512, AVX2+FMA, NEON, portable; TSKERNELS_CPU_ISA caps the level) against float64 math
on the dequantized weights, the prefill (M > 16) hand-over, and bad input."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
from tskernels.numerics import assert_close
from tskernels.ops.gemm import cpu_stream

from ._cpu_paths import each_path


def _dequant64(q, scale, mins):
    n, half = q.shape
    g = q.view(n, half // 16, 16)
    nib = torch.cat([g & 15, g >> 4], dim=2).double()
    return (nib * scale.double()[..., None] + mins.double()[..., None]).reshape(n, 2 * half)




@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), groups=st.integers(1, 6),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_quantizer_error_bound_and_packing(seed, n, groups, dtype):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, 32 * groups, generator=g) * 0.05).to(dtype)
    w[0, :32] = 0.25  # a constant group: scale 0, exact
    q, scale, mins = tskernels.gemm.quantize_q4_groups(w)
    assert q.dtype == torch.uint8 and q.shape == (n, 16 * groups)
    assert scale.shape == mins.shape == (n, groups) and scale.dtype == torch.float32
    deq = _dequant64(q, scale, mins)
    err = (deq - w.double()).abs().view(n, groups, 32).amax(dim=2)
    assert (err <= scale.double() / 2 * (1 + 1e-5) + 1e-6 * w.double().abs().max()).all()
    assert scale[0, 0] == 0 and torch.equal(deq[0, :32], w[0, :32].double())
    # byte j of a group: element j low nibble, element 16 + j high nibble
    nib = torch.round((w.double()[:, :32] - mins.double()[:, :1]) /
                      scale.double()[:, :1].clamp_min(1e-30)).clamp(0, 15)
    nib[0] = 0
    assert torch.equal((q[:, :16] & 15).long(), nib[:, :16].long())
    assert torch.equal((q[:, :16] >> 4).long(), nib[:, 16:].long())


@pytest.mark.skipif(not cpu_stream.available(), reason="tskernels._cpu not built")
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 16), n=st.integers(1, 150),
       groups=st.integers(1, 8), threads=st.sampled_from([1, 2]))
def test_every_simd_path_matches_float64(seed, m, n, groups, threads):
    g = torch.Generator().manual_seed(seed)
    k = 32 * groups
    a = torch.randn(m, k, generator=g)
    q, scale, mins = tskernels.gemm.quantize_q4_groups(torch.randn(n, k, generator=g))
    truth = a.double() @ _dequant64(q, scale, mins).t()

    def check(path):
        c = torch.full((m, n), float("nan"))
        cpu_stream._cpu.gemm_q4w(a.data_ptr(), q.data_ptr(), scale.data_ptr(),
                                 mins.data_ptr(), c.data_ptr(), m, n, k, k, k // 2, n)
        assert_close(c, truth, dtype=torch.float32, name=f"4-bit weights, {path} path")
    each_path(check, threads)


@pytest.mark.parametrize("backend", ["reference"] + (["cpu_stream"] if cpu_stream.available()
                                                     else []))
@pytest.mark.parametrize("m,n,k", [(1, 4096, 576), (8, 576, 1536), (5, 130, 64),
                                   (40, 70, 96), (300, 33, 64)])
@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16])
def test_q4w_mm_matches_dequantized_float64(backend, m, n, k, a_dtype):
    g = torch.Generator().manual_seed(m * 1000 + n)
    a = torch.randn(m, k, generator=g).to(a_dtype)
    q, scale, mins = tskernels.gemm.quantize_q4_groups(torch.randn(n, k, generator=g) * 0.02)
    truth = a.double() @ _dequant64(q, scale, mins).t()
    c = tskernels.gemm.q4w_mm(a, q, scale, mins, backend=backend)
    assert c.dtype == a_dtype and c.shape == (m, n)
    assert_close(c, truth, dtype=a_dtype, name=f"q4w_mm {backend}")
    c32 = tskernels.gemm.q4w_mm(a, q, scale, mins, out_dtype=torch.float32, backend=backend)
    assert c32.dtype == torch.float32


def test_q4w_mm_rejects_bad_input():
    q, s, mn = tskernels.gemm.quantize_q4_groups(torch.randn(8, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        tskernels.gemm.q4w_mm(torch.randn(2, 48), q, s, mn)
    with pytest.raises(ValueError, match="multiple of 32"):
        tskernels.gemm.quantize_q4_groups(torch.randn(8, 48))
    with pytest.raises((ValueError, TypeError), match="q"):
        tskernels.gemm.q4w_mm(torch.randn(2, 64), q.to(torch.int8), s, mn)
    with pytest.raises((ValueError, TypeError), match="scale"):
        tskernels.gemm.q4w_mm(torch.randn(2, 64), q, s[:, :1], mn)
    with pytest.raises((ValueError, TypeError), match="mins"):
        tskernels.gemm.q4w_mm(torch.randn(2, 64), q, s, mn.double())
    if cpu_stream.available():
        c = torch.empty(2, 8)
        a = torch.randn(2, 48)
        with pytest.raises(ValueError, match="multiple of 32"):
            cpu_stream._cpu.gemm_q4w(a.data_ptr(), q.data_ptr(), s.data_ptr(), mn.data_ptr(),
                                     c.data_ptr(), 2, 8, 48, 48, 24, 8)


def _act8_truth(a, q, scale, mins):
    """float64 of the act_int8 formula on the reference's (float32) activation quantization."""
    from tskernels_ref.gemm import quantize_act_int8_groups

    xq, sx, sums = quantize_act_int8_groups(a)
    m, k = a.shape
    n = q.shape[0]
    g = q.view(n, k // 32, 16)
    nib = torch.cat([g & 15, g >> 4], dim=2).double()
    dots = torch.einsum("mgk,ngk->mng", xq.double().view(m, -1, 32), nib)
    return (dots * sx.double()[:, None, :] * scale.double()[None]).sum(-1) \
        + sums.double() @ mins.double().t()


@pytest.mark.skipif(not cpu_stream.available(), reason="tskernels._cpu not built")
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 16), n=st.integers(1, 150),
       groups=st.integers(1, 8), threads=st.sampled_from([1, 2]))
def test_act_int8_every_path_matches_float64(seed, m, n, groups, threads):
    g = torch.Generator().manual_seed(seed)
    k = 32 * groups
    a = torch.randn(m, k, generator=g) * 3
    a[0, :32] = 0  # an all-zero activation group
    q, scale, mins = tskernels.gemm.quantize_q4_groups(torch.randn(n, k, generator=g))
    truth = _act8_truth(a, q, scale, mins)

    def check(path):
        c = torch.full((m, n), float("nan"))
        cpu_stream._cpu.gemm_q4w(a.data_ptr(), q.data_ptr(), scale.data_ptr(),
                                 mins.data_ptr(), c.data_ptr(), m, n, k, k, k // 2, n,
                                 act_int8=True)
        assert_close(c, truth, dtype=torch.float32, name=f"4-bit x int8, {path} path")
    each_path(check, threads)


@pytest.mark.parametrize("backend", ["reference"] + (["cpu_stream"] if cpu_stream.available()
                                                     else []))
@pytest.mark.parametrize("m", [1, 8, 40])
def test_act_int8_op_and_its_error_vs_float_activations(backend, m):
    g = torch.Generator().manual_seed(m)
    a = torch.randn(m, 576, generator=g)
    q, scale, mins = tskernels.gemm.quantize_q4_groups(torch.randn(1536, 576, generator=g) * .02)
    c = tskernels.gemm.q4w_mm(a, q, scale, mins, act_int8=True, backend=backend)
    assert_close(c, _act8_truth(a, q, scale, mins), dtype=torch.float32, name=backend)
    # 8-bit activation groups of Gaussian rows: ~1 % relative error against float activations
    exact = a.double() @ _dequant64(q, scale, mins).t()
    assert float((c.double() - exact).norm() / exact.norm()) < 0.02
