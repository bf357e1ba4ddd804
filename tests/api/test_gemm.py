"""Public gemm ops: equal to tskernels_ref on CPU, reference selected there, bad input named."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref

from ._helpers import assert_reference_selected, assert_same

gemm = tskernels.gemm
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@given(m=st.integers(0, 40), n=st.integers(1, 50), k=st.integers(1, 70),
       dtype=st.sampled_from(DTYPES), out_dtype=st.sampled_from([None, torch.float32]))
def test_mm_and_gemv_equal_reference(m, n, k, dtype, out_dtype):
    a, b = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    assert_same(gemm.mm(a, b, out_dtype=out_dtype), ref.mm(a, b, out_dtype=out_dtype))
    a = a[:16]
    assert_same(gemm.gemv(a, b, out_dtype=out_dtype), ref.gemv(a, b, out_dtype=out_dtype))


@pytest.mark.parametrize("m,n,k,block", [(3, 200, 300, 128), (1, 17, 33, 16), (0, 8, 8, 8)])
def test_fp8_block_mm_equals_reference(m, n, k, block):
    a, a_scale = gemm.quantize_fp8_per_token_group(torch.randn(m, k), block)
    b, b_scale = gemm.quantize_fp8_block(torch.randn(n, k), block)
    for out_dtype in (torch.bfloat16, torch.float32):
        assert_same(gemm.fp8_block_mm(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block),
                    ref.fp8_block_mm(a, a_scale, b, b_scale, out_dtype=out_dtype, block=block))


def test_quantizers_equal_reference():
    x = torch.randn(5, 300) * 3
    assert_same(gemm.quantize_fp8_per_token_group(x, 64), ref.quantize_fp8_per_token_group(x, 64))
    assert_same(gemm.silu_and_mul_quantize_fp8(x), ref.silu_and_mul_quantize_fp8(x))
    assert_same(gemm.quantize_fp8_per_channel(x), ref.quantize_fp8_per_channel(x))
    assert_same(gemm.quantize_fp8_per_tensor(x), ref.quantize_fp8_per_tensor(x))
    s = torch.tensor([0.02])
    assert_same(gemm.quantize_fp8_per_tensor(x, s), ref.quantize_fp8_per_tensor(x, s))
    assert gemm.quantize_fp8_block is ref.quantize_fp8_block


def test_gemv_residual_equals_reference():
    a, b, r = torch.randn(3, 40).half(), torch.randn(24, 40).half(), torch.randn(3, 24).half()
    assert_same(gemm.gemv(a, b, residual=r), ref.gemv(a, b, residual=r))
    # a backend without the fused epilogue (cpu_stream): fp32 product + residual, one rounding
    if any(k.backend == "cpu_stream" for k in tskernels.kernels("gemm", "gemv")):
        a32, b32, r32 = a.float(), b.float(), r.float()
        got = gemm.gemv(a32, b32, residual=r32, backend="cpu_stream")
        torch.testing.assert_close(got, ref.gemv(a32, b32, residual=r32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,formats", [
    ("mm", {"a": "bf16", "b": "bf16", "c": "bf16"}),
    ("gemv", {"a": "fp16", "b": "fp16", "c": "fp32"}),
    ("fp8_block_mm", {"a": "fp8_e4m3", "b": "fp8_e4m3", "c": "bf16"}),
    ("quantize_fp8_per_token_group", {"x": "bf16"}),
    ("silu_and_mul_quantize_fp8", {"x": "bf16"}),
    ("quantize_fp8_per_channel", {"x": "fp32"}),
    ("quantize_fp8_per_tensor", {"x": "fp16"}),
])
def test_reference_selected_on_cpu(op, formats):
    assert_reference_selected("gemm", op, formats=formats)


A, B = torch.randn(4, 64), torch.randn(8, 64)
QA, SA = ref.quantize_fp8_per_token_group(torch.randn(4, 64), 32)
QB, SB = ref.quantize_fp8_block(torch.randn(40, 64), 32)
META = torch.device("meta")

BAD = [
    (lambda: gemm.mm(A[0], B), ValueError, "a: expected 2 dimensions"),
    (lambda: gemm.mm(A.int(), B), TypeError, "a: expected dtype"),
    (lambda: gemm.mm(A, B.half()), TypeError, "b: expected dtype float32"),
    (lambda: gemm.mm(A, B[:, :63]), ValueError, "b: expected shape"),
    (lambda: gemm.mm(A, B.to(META)), ValueError, "b: expected a tensor on cpu"),
    (lambda: gemm.mm(A, B, out_dtype=torch.int32), TypeError, "out_dtype"),
    (lambda: gemm.gemv(torch.randn(17, 64), B), ValueError, "a: gemv takes at most 16"),
    (lambda: gemm.gemv(A, B[:, :8]), ValueError, "b: expected shape"),
    (lambda: gemm.fp8_block_mm(A, SA, QB, SB, block=32), TypeError, "a: expected dtype"),
    (lambda: gemm.fp8_block_mm(QA, SA, B, SB, block=32), TypeError, "b: expected dtype"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB[:, :32], SB, block=32), ValueError, "b: expected shape"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB, SB, block=0), ValueError, "block: expected a positive"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB, SB, block=64), ValueError,
     r"a_scale: expected shape \(4, 1\)"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB, SB[:1], block=32), ValueError,
     r"b_scale: expected shape \(2, 2\)"),
    (lambda: gemm.fp8_block_mm(QA, SA.half(), QB, SB, block=32), TypeError,
     "a_scale: expected dtype"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB, SB.to(META), block=32), ValueError,
     "b_scale: expected a tensor on"),
    (lambda: gemm.fp8_block_mm(QA, SA, QB, SB, block=32, out_dtype=torch.int8), TypeError,
     "out_dtype"),
    (lambda: gemm.gemv(A, B, residual=torch.randn(4, 7)), ValueError, "residual: expected shape"),
    (lambda: gemm.gemv(A, B, residual=torch.randn(4, 8).half()), TypeError,
     "residual: expected dtype"),
    (lambda: gemm.quantize_fp8_per_token_group(A[0]), ValueError, "x: expected 2 dimensions"),
    (lambda: gemm.quantize_fp8_per_token_group(A.double()), TypeError, "x: expected dtype"),
    (lambda: gemm.quantize_fp8_per_token_group(A, 0), ValueError, "group: expected a positive"),
    (lambda: gemm.quantize_fp8_per_token_group(A, eps=0.0), ValueError, "eps: expected"),
    (lambda: gemm.silu_and_mul_quantize_fp8(torch.randn(4, 63)), ValueError, "x: expected an even"),
    (lambda: gemm.quantize_fp8_per_channel(A.int()), TypeError, "x: expected dtype"),
    (lambda: gemm.quantize_fp8_per_tensor(A, torch.ones(2)), ValueError, "scale: expected one"),
    (lambda: gemm.quantize_fp8_per_tensor(A, torch.ones(1).half()), TypeError,
     "scale: expected dtype"),
]


@pytest.mark.parametrize("call,exc,match", BAD)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
