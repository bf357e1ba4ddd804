"""The CPU backend "cpu_native" (fp32 RMSNorm, fused add + RMSNorm, SiLU-and-mul, RoPE in C++)
vs float64 math through tskernels_ref: ragged row counts (0 and 1 included), widths that are no
multiple of the vector length, strided inputs, 2-4-D norms, partial rotary, both RoPE styles,
int32 / int64 positions, bad positions."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.activation as ref_act
import tskernels_ref.norm as ref_norm
import tskernels_ref.rope as ref_rope
from tskernels.numerics import assert_close
from tskernels.ops._common import cpu_extension

B = "cpu_native"
pytestmark = pytest.mark.skipif(not tskernels.available("norm", "rmsnorm", B, device="cpu"),
                                reason="tskernels._cpu extension not built")


DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([0, 1, 3, 17, 130]),
       n=st.sampled_from([1, 15, 64, 576, 1000]), lead=st.sampled_from([(), (2,)]),
       strided=st.booleans(), dtype=DTYPES, w_dtype=DTYPES)
def test_rmsnorm_and_fused_add(seed, rows, n, lead, strided, dtype, w_dtype):
    g = torch.Generator().manual_seed(seed)
    shape = (*lead, rows, n)
    x = torch.randn(*shape[:-1], n + 5, generator=g)[..., :n] if strided else \
        torch.randn(shape, generator=g) * 3
    x = x.to(dtype)
    res = torch.randn(shape, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(w_dtype)
    got = tskernels.norm.rmsnorm(x, w, 1e-5, backend=B)
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, ref_norm.rmsnorm(x.double(), w.double(), 1e-5),
                 baseline=ref_norm.rmsnorm(x, w, 1e-5))
    out = torch.full(shape, float("nan"), dtype=dtype)
    assert tskernels.norm.rmsnorm(x, w, 1e-5, out=out, backend=B) is out
    assert torch.equal(out, got)
    y, new_res = tskernels.norm.fused_add_rmsnorm(x, res, w, 1e-6, backend=B)
    y64, r64 = ref_norm.fused_add_rmsnorm(x.double(), res.double(), w.double(), 1e-6)
    if dtype == torch.bfloat16:  # the norm reads the rounded residual, as the reference does
        y64 = ref_norm.rmsnorm(r64.to(dtype).double(), w.double(), 1e-6)
    assert_close(new_res, r64)
    assert_close(y, y64, baseline=ref_norm.fused_add_rmsnorm(x, res, w, 1e-6)[0])


@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([0, 1, 2, 9, 64]),
       inter=st.sampled_from([1, 7, 16, 1536, 2050]), dtype=DTYPES)
def test_silu_and_mul(seed, rows, inter, dtype):
    g = torch.Generator().manual_seed(seed)
    xd = (torch.randn(rows, 2 * inter, generator=g) * 4).to(dtype)
    got = tskernels.activation.silu_and_mul(xd, backend=B)
    assert got.dtype == dtype
    assert_close(got, ref_act.silu_and_mul(xd.double()), baseline=ref_act.silu_and_mul(xd))
    x = xd.float()
    want = ref_act.silu_and_mul(x.double())
    portable = torch.empty(rows, inter)  # the loop CPUs without AVX-512 run
    cpu_extension().silu_and_mul_f32(x.data_ptr(), x.stride(0), portable.data_ptr(), inter, rows,
                                     inter, vector=False)
    assert_close(portable, want, baseline=ref_act.silu_and_mul(x))


@given(seed=st.integers(0, 2**31 - 1), t=st.sampled_from([0, 1, 5, 33]),
       heads=st.sampled_from([(1, 1), (9, 3), (4, None)]), d=st.sampled_from([16, 64, 80]),
       partial=st.booleans(), style=st.sampled_from(["neox", "gptj"]),
       pos_dtype=st.sampled_from([torch.int32, torch.int64]), inplace=st.booleans(),
       strided=st.booleans(), dtype=DTYPES)
def test_rope(seed, t, heads, d, partial, style, pos_dtype, inplace, strided, dtype):
    g = torch.Generator().manual_seed(seed)
    hq, hk = heads
    r = d // 2 if partial else d
    cache = ref_rope.cos_sin_cache(500, r, 10000.0)
    q = torch.randn(t, hq, d, generator=g)
    if strided:  # q as a view into a fused qkv row: token stride > heads * d
        q = torch.randn(t, hq + 2, d, generator=g)[:, :hq]
    k = None if hk is None else torch.randn(t, hk, d, generator=g).to(dtype)
    q = q.to(dtype)
    pos = torch.randint(0, 500, (t,), generator=g).to(pos_dtype)
    q64, k64 = ref_rope.apply_rope(q.double(), None if k is None else k.double(), pos,
                                   cache.double(), style=style)
    q32, k32 = ref_rope.apply_rope(q, k, pos, cache, style=style)
    qi, ki = q.clone(), None if k is None else k.clone()
    qo, ko = tskernels.rope.apply_rope(qi, ki, pos, cache, style=style, inplace=inplace,
                                       backend=B)
    assert_close(qo, q64, baseline=q32)
    if k is not None:
        assert_close(ko, k64, baseline=k32)
    if inplace:
        assert qo is qi and torch.equal(qi, qo)
    else:
        assert torch.equal(qi, q)  # inputs untouched


def test_rope_rejects_positions_outside_the_cache():
    cache = ref_rope.cos_sin_cache(8, 16)
    q = torch.randn(2, 1, 16)
    with pytest.raises(ValueError, match="positions"):
        tskernels.rope.apply_rope(q, None, torch.tensor([3, 8]), cache, backend=B)


def test_cpu_native_is_opt_in():
    prob = dict(device="cpu", formats={"x": "fp32", "weight": "fp32"}, traits={"hidden": 64})
    assert tskernels.select("norm", "rmsnorm", **prob).backend == "reference"
    assert tskernels.select("norm", "rmsnorm", backend=B, **prob).backend == B
    with pytest.raises(tskernels.SelectionError):
        tskernels.select("norm", "rmsnorm", backend=B, device="cpu",
                         formats={"x": "fp16", "weight": "fp16"}, traits={"hidden": 64})
