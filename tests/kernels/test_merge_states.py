"""merge_states Triton kernel vs the float64 reference, including empty (-inf) sides."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.attention as ref
from tskernels.numerics import assert_close


@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 5, 17]),
       h=st.integers(1, 9), d=st.sampled_from([16, 64, 80, 128, 256]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       empty=st.sampled_from(["none", "a", "b", "both"]))
def test_merge_states_triton(kernel_device, seed, n, h, d, dtype, empty):
    torch.manual_seed(seed)
    o_a = torch.randn(n, h, d).to(kernel_device, dtype)
    o_b = torch.randn(n, h, d).to(kernel_device, dtype)
    lse_a = (torch.randn(n, h) * 4).to(kernel_device)
    lse_b = (torch.randn(n, h) * 4).to(kernel_device)
    if n and empty in ("a", "both"):
        lse_a[0] = float("-inf")
    if n and empty in ("b", "both"):
        lse_b[0] = float("-inf")
    o, lse = tskernels.attention.merge_states(o_a, lse_a, o_b, lse_b, backend="triton")
    o64, lse64 = ref.merge_states(o_a.double(), lse_a.double(), o_b.double(), lse_b.double())
    ob, _ = ref.merge_states(o_a, lse_a, o_b, lse_b)
    assert_close(o, o64, baseline=ob, name="o")
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(lse64.cpu()))
    fin = torch.isfinite(lse64.cpu())
    assert_close(lse.cpu()[fin], lse64.cpu()[fin].float(), name="lse")
    if n and empty == "both":
        assert torch.all(o[0] == 0)
