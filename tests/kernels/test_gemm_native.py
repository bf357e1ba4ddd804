"""gemm.mm's opt-in native-dtype backend ("torch_native") vs the float64 reference, on the CPU
and (GPU tier) on the GPU."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close
from tskernels.ops.gemm.torch_native import BACKEND


@given(seed=st.integers(0, 2**31 - 1), m=st.sampled_from([0, 1, 3, 8, 33]),
       n=st.integers(1, 300), k=st.integers(1, 300),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       out=st.sampled_from([None, torch.float32]))
def test_native_mm_matches_reference(kernel_device, seed, m, n, k, dtype, out):
    torch.manual_seed(seed)
    a = torch.randn(m, k).to(kernel_device, dtype)
    b = torch.randn(n, k).to(kernel_device, dtype)
    got = tskernels.gemm.mm(a, b, out_dtype=out, backend=BACKEND)
    assert got.dtype == (out or dtype) and got.device == a.device
    truth = ref.mm(a.double(), b.double())
    assert_close(got, truth, dtype=dtype, baseline=ref.mm(a, b, out_dtype=out))


def test_native_mm_is_opt_in():
    prob = dict(device="cpu", formats={"a": "bf16", "b": "bf16", "c": "bf16"})
    assert tskernels.select("gemm", "mm", **prob).backend == "reference"
    assert tskernels.select("gemm", "mm", backend=BACKEND, **prob).backend == BACKEND
