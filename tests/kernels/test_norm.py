"""RMSNorm kernels vs the float64 reference (interpreter on CPU, the real GPU with -m gpu)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.norm as ref
from tskernels.numerics import assert_close
from tskernels.testing.problems import poisoned_like
from tskernels.testing.strategies import row_shapes

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@given(seed=st.integers(0, 2**31 - 1), shape=row_shapes(max_rows=40, max_cols=700), dtype=st.sampled_from(DTYPES),
       eps=st.sampled_from([1e-6, 1e-5]), scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_rmsnorm_triton(kernel_device, seed, shape, dtype, eps, scale):
    torch.manual_seed(seed)
    x = (torch.randn(shape) * scale).to(kernel_device, dtype)
    w = torch.randn(shape[1]).to(kernel_device, dtype)
    out = poisoned_like(x)
    y = tskernels.norm.rmsnorm(x, w, eps, out=out, backend="triton")
    assert y.data_ptr() == out.data_ptr()
    assert_close(y, ref.rmsnorm(x.double(), w.double(), eps),
                 baseline=ref.rmsnorm(x, w, eps), name="rmsnorm")


@given(seed=st.integers(0, 2**31 - 1), shape=row_shapes(max_rows=40, max_cols=700), dtype=st.sampled_from(DTYPES))
def test_fused_add_rmsnorm_triton(kernel_device, seed, shape, dtype):
    torch.manual_seed(seed)
    x = torch.randn(shape).to(kernel_device, dtype)
    r = torch.randn(shape).to(kernel_device, dtype)
    w = torch.randn(shape[1]).to(kernel_device, dtype)
    y, r_out = tskernels.norm.fused_add_rmsnorm(x, r, w, backend="triton")
    # The residual sum is rounded to the input dtype, as eager torch does (the interpreter may
    # round bf16 differently from hardware, so compare within bf16's tolerance, not bitwise).
    assert_close(r_out, x.double() + r.double(), baseline=x + r, name="residual")
    y_ref, _ = ref.fused_add_rmsnorm(x.double(), r.double(), w.double())
    y_ref64 = ref.rmsnorm((x + r).double(), w.double())
    assert_close(y, y_ref64, baseline=ref.fused_add_rmsnorm(x, r, w)[0], name="y")
    assert y_ref.shape == y.shape


def test_rmsnorm_3d_input(kernel_device):
    x = torch.randn(3, 5, 64, device=kernel_device)
    w = torch.rand(64, device=kernel_device)
    y = tskernels.norm.rmsnorm(x, w, backend="triton")
    assert_close(y, ref.rmsnorm(x.double(), w.double()))


def test_rmsnorm_rejects_bad_input():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="weight"):
        tskernels.norm.rmsnorm(x, torch.ones(7))
    with pytest.raises(TypeError, match="x: expected dtype"):
        tskernels.norm.rmsnorm(x.int(), torch.ones(8))
    with pytest.raises(ValueError, match="eps"):
        tskernels.norm.rmsnorm(x, torch.ones(8), eps=0.0)
    with pytest.raises(ValueError, match="contiguous"):
        tskernels.norm.rmsnorm(x.t(), torch.ones(4))
    with pytest.raises(ValueError, match="residual"):
        tskernels.norm.fused_add_rmsnorm(x, torch.randn(4, 9), torch.ones(8))


def test_default_selection_on_cpu_is_reference():
    x = torch.randn(4, 8)
    k = tskernels.select("norm", "rmsnorm", device=x.device, formats={"x": "fp32"})
    assert k.backend == "reference"
    torch.testing.assert_close(tskernels.norm.rmsnorm(x, torch.ones(8)),
                               ref.rmsnorm(x, torch.ones(8)))


def test_chained_launches_match_the_reference(kernel_device, monkeypatch):
    """The chained wrapper (shared/pdl.CHAIN "rmsnorm": a programmatic dependent launch that
    triggers its dependents at start on sm_90+, the wrapper without PDL elsewhere) gives the
    plain kernel's results, with and without the residual."""
    from tskernels.ops.shared import pdl
    monkeypatch.setattr(pdl, "CHAIN", frozenset({"rmsnorm"}))
    dt = torch.float16
    x = torch.randn(3, 96).to(kernel_device, dt)
    r = torch.randn(3, 96).to(kernel_device, dt)
    w = torch.randn(96).to(kernel_device, dt)
    y = tskernels.norm.rmsnorm(x, w, 1e-6, out=poisoned_like(x), backend="triton")
    assert_close(y, ref.rmsnorm(x.double(), w.double(), 1e-6), baseline=ref.rmsnorm(x, w, 1e-6))
    y, r_out = tskernels.norm.fused_add_rmsnorm(x, r, w, backend="triton")
    assert_close(r_out, x.double() + r.double(), baseline=x + r, name="residual")
    assert_close(y, ref.rmsnorm((x + r).double(), w.double()),
                 baseline=ref.fused_add_rmsnorm(x, r, w)[0], name="y")


def test_short_row_heuristic_keeps_enough_programs():
    """Rows of <= 256 columns: several rows per program only while n_rows / rows stays at or
    above SHORT_ROW_MIN_PROGRAMS (H200: 1024 rows fastest at 1 per program, 8192 at 4, 262144
    at 8); wider rows keep the table (a few KB per program)."""
    from tskernels.ops.norm.triton import SHORT_ROW_MIN_PROGRAMS, _launch_params
    assert SHORT_ROW_MIN_PROGRAMS == 2048
    assert _launch_params(128, 1024) == (128, 1, 1)
    assert _launch_params(64, 8192) == (64, 1, 4)
    assert _launch_params(256, 262144) == (256, 1, 8)
    assert _launch_params(256, 100) == (256, 1, 1)
    assert _launch_params(512, 1024) == (512, 2, 4)
    assert _launch_params(4096, 1 << 20) == (4096, 16, 1)
