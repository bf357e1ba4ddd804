"""gemm.mm / gemm.gemv's CPU weight-streaming backend ("cpu_stream") vs the float64 reference:
every M in 0..16 (the kernel's row-group and weight-block tails), K not a multiple of the
16-lane vector, N around the thread split, strided operands, the portable fallback, and the
hand-over to torch.mm above 16 rows."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close
from tskernels.ops.gemm import cpu_stream

pytestmark = pytest.mark.skipif(not cpu_stream.available(),
                                reason="tskernels._cpu extension not built")


@given(seed=st.integers(0, 2**31 - 1), m=st.integers(0, 16), n=st.integers(1, 300),
       k=st.integers(1, 300), threads=st.sampled_from([1, 2, 3]),
       out=st.sampled_from([None, torch.float32, torch.float64]),
       op=st.sampled_from(["mm", "gemv"]), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_cpu_stream_matches_reference(seed, m, n, k, threads, out, op, dtype):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = getattr(tskernels.gemm, op)(a, b, out_dtype=out, backend=cpu_stream.BACKEND)
    finally:
        torch.set_num_threads(prev)
    assert got.dtype == (out or dtype) and got.shape == (m, n)
    assert_close(got, ref.mm(a.double(), b.double()), dtype=out if out == torch.float32 else dtype,
                 baseline=ref.mm(a, b, out_dtype=out))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 49152, 576), (8, 3072, 576), (16, 576, 1536),
                                   (5, 1000, 17), (3, 130, 2000)])
def test_cpu_stream_large_and_threaded(m, n, k, dtype):
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    got = tskernels.gemm.mm(a, b, backend=cpu_stream.BACKEND)
    assert_close(got, ref.mm(a.double(), b.double()), dtype=dtype, baseline=ref.mm(a, b))


def test_cpu_stream_strided_operands_and_portable_path():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(12, 2 * 70, generator=g)
    a = big[:, ::2]            # non-unit inner stride: copied
    b = torch.randn(70, 300, generator=g)[:, 10:80]  # row stride 300 > k: used in place
    truth = ref.mm(a.double(), b.double())
    assert_close(tskernels.gemm.mm(a, b, backend=cpu_stream.BACKEND), truth, dtype=torch.float32)
    # the portable loop (what runs on CPUs without AVX-512) against the same truth
    c = torch.empty(12, 70)
    ac = a.contiguous()
    cpu_stream._cpu.gemm_f32(ac.data_ptr(), b.data_ptr(), c.data_ptr(), 12, 70, 70, 70,
                             b.stride(0), 70, vector=False)
    assert_close(c, truth, dtype=torch.float32)
    bb = b.bfloat16()  # bf16 weights, both paths, against the truth on the rounded weights
    truth_b = ref.mm(a.double(), bb.double())
    for vector in (True, False):
        cpu_stream._cpu.gemm_bf16w(ac.data_ptr(), bb.data_ptr(), c.data_ptr(), 12, 70, 70, 70,
                                   bb.stride(0), 70, vector=vector)
        assert_close(c, truth_b, dtype=torch.float32, name=f"bf16 weights, vector={vector}")


def test_cpu_stream_prefill_rows_use_torch_mm():
    a, b = torch.randn(40, 64), torch.randn(32, 64)
    got = tskernels.gemm.mm(a, b, backend=cpu_stream.BACKEND)
    assert_close(got, ref.mm(a.double(), b.double()), dtype=torch.float32)


def test_cpu_stream_is_opt_in_and_rejects_bad_input():
    prob = dict(device="cpu", formats={"a": "fp32", "b": "fp32", "c": "fp32"})
    assert tskernels.select("gemm", "mm", **prob).backend == "reference"
    assert tskernels.select("gemm", "mm", backend=cpu_stream.BACKEND, **prob).backend == \
        cpu_stream.BACKEND
    with pytest.raises(Exception, match="fp16|backend|format|cpu_stream"):
        tskernels.gemm.mm(torch.randn(2, 8).half(), torch.randn(4, 8).half(),
                          backend=cpu_stream.BACKEND)
    with pytest.raises(ValueError, match="M <= 16"):
        cpu_stream._cpu.gemm_f32(0, 0, 0, 17, 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="leading"):
        cpu_stream._cpu.gemm_f32(0, 0, 0, 2, 4, 8, 4, 8, 4)
