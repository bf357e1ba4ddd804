"""Fused decode gemvs (gemm.rmsnorm_gemv, gemm.silu_mul_gemv, the early-stream plain gemv) vs
the float64 reference and vs the unfused pair: the interpreter on CPU (fp16), the GPU with
-m gpu (fp16 and bf16, Llama-3-8B shapes, PDL chains under graph replay)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close
from tskernels.ops.gemm import triton_gemv
from tskernels.ops.gemm import triton_gemv_fused as tf

ON_GPU = torch.cuda.is_available()
DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]
MAX_N = 300 if ON_GPU else 80
MAX_K = 2400 if ON_GPU else 400
EPS = 1e-5


def _problem(op, m, n, k, dtype, device, seed, residual):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, 2 * k if op == "silu_mul" else k, generator=g) * 2).to(device, dtype)
    b = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    nw = (1 + 0.3 * torch.randn(k, generator=g)).to(device, dtype)
    r = torch.randn(m, n, generator=g).to(device, dtype) if residual else None
    return x, b, nw, r


def _fused(op, x, b, nw, r, out_dtype=None, backend="triton"):
    if op == "rmsnorm":
        return tskernels.gemm.rmsnorm_gemv(x, nw, b, eps=EPS, residual=r, out_dtype=out_dtype,
                                           backend=backend)
    return tskernels.gemm.silu_mul_gemv(x, b, residual=r, out_dtype=out_dtype, backend=backend)


def _ref(op, x, b, nw, r, out_dtype=None):
    if op == "rmsnorm":
        return ref.rmsnorm_gemv(x, nw, b, eps=EPS, residual=r, out_dtype=out_dtype)
    return ref.silu_mul_gemv(x, b, residual=r, out_dtype=out_dtype)


def _f64(t):
    return None if t is None else t.double()


def _workspace_clean(device) -> None:
    ws, cnt = triton_gemv._workspace(torch.device(device))
    assert int(cnt.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0
    ss = tf._ss_ws.get(torch.device(device))
    assert ss is None or float(ss.abs().sum()) == 0.0


@settings(max_examples=10 if not ON_GPU else 12, deadline=None)  # GPU: compiles dominate
@given(op=st.sampled_from(["rmsnorm", "silu_mul"]), m=st.integers(1, 16),
       n=st.integers(1, MAX_N), k=st.integers(1, MAX_K), dtype=st.sampled_from(DTYPES),
       residual=st.booleans(), out_dtype=st.sampled_from([None, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_fused_gemv_vs_reference(kernel_device, op, m, n, k, dtype, residual, out_dtype, seed):
    x, b, nw, r = _problem(op, m, n, k, dtype, kernel_device, seed, residual)
    c = _fused(op, x, b, nw, r, out_dtype)
    assert c.shape == (m, n) and c.dtype == (out_dtype or dtype)
    want = _ref(op, x.double(), b.double(), _f64(nw), _f64(r))
    assert_close(c, want, dtype=dtype, baseline=_ref(op, x, b, nw, r, out_dtype),
                 name=f"{op}_gemv")


@pytest.mark.parametrize("op", ["rmsnorm", "silu_mul"])
@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (5, 96, 200), (16, 130, 392)])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_matches_unfused_pair_and_poisoned_output(kernel_device, op, m, n, k, residual):
    """Against the unfused pair of kernels the serving path ran before (norm / activation op,
    then gemm.gemv) and the float64 reference, within the fp16 tolerance: not bitwise, the
    fused RMSNorm rounds x * norm_weight (rstd scales the fp32 product in the epilogue) where
    the pair rounds x * rstd * norm_weight. Outputs start NaN; K not a multiple of BK (200,
    392) takes the masked loop; the interpreter's 4 'SMs' make these split-K launches (the
    row sums of squares meet in the split workspace too, which is left clean)."""
    x, b, nw, r = _problem(op, m, n, k, torch.float16, kernel_device, m * n + k, residual)
    act = tskernels.norm.rmsnorm(x, nw, EPS) if op == "rmsnorm" else \
        tskernels.activation.silu_and_mul(x)
    unfused = tskernels.gemm.gemv(act, b, residual=r, backend="triton")
    for early in (True, False):
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device=kernel_device)
        pro = tf.PRO_RMSNORM if op == "rmsnorm" else tf.PRO_SILU_MUL
        tf.fused_stream_mm(x, b, out, prologue=pro, norm_weight=nw, eps=EPS, residual=r,
                           early=early)
        assert not torch.isnan(out).any()
        assert_close(out, unfused.float(), dtype=torch.float16, name=f"{op} early={early}")
        assert_close(out, _ref(op, x.double(), b.double(), _f64(nw), _f64(r)),
                     baseline=_ref(op, x, b, nw, r), name=f"{op} vs f64")
    assert triton_gemv.plan(m, n, k, False, torch.device(kernel_device))[1] > 1 or n >= 96
    _workspace_clean(kernel_device)


@settings(max_examples=10 if not ON_GPU else 16, deadline=None)
@given(op=st.sampled_from(["rmsnorm", "silu_mul"]), n=st.integers(1, MAX_N),
       k=st.integers(1, MAX_K), dtype=st.sampled_from(DTYPES), residual=st.booleans(),
       out_dtype=st.sampled_from([torch.float16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_fused_rows_kernel(kernel_device, op, n, k, dtype, residual, out_dtype, seed):
    """M = 1: the CUDA-core persistent rows form with the RMSNorm / SiLU-mul prologue, any N, K
    (masked K tails; under the interpreter 4 programs, so most draws give a program several
    row blocks), into a NaN-poisoned output, against float64 and the unfused pair."""
    x, b, nw, r = _problem(op, 1, n, k, dtype, kernel_device, seed, residual)
    out = torch.full((1, n), float("nan"), dtype=out_dtype, device=kernel_device)
    pro = tf.PRO_RMSNORM if op == "rmsnorm" else tf.PRO_SILU_MUL
    tf.fused_rows_mm(x, b, out, prologue=pro, norm_weight=nw, eps=EPS, residual=r)
    assert_close(out, _ref(op, x.double(), b.double(), _f64(nw), _f64(r)), dtype=dtype,
                 baseline=_ref(op, x, b, nw, r, out_dtype), name=f"{op} rows")
    act = tskernels.norm.rmsnorm(x, nw, EPS) if op == "rmsnorm" else \
        tskernels.activation.silu_and_mul(x)
    unfused = tskernels.gemm.gemv(act, b, residual=r, backend="triton")
    assert_close(out, unfused.float(), dtype=dtype, name=f"{op} rows vs unfused pair")


def test_fused_m1_dispatch(kernel_device, monkeypatch):
    """M = 1 public calls take the rows form (tf.ROWS_M1, and triton_gemv.ROWS_M1 not None);
    M = 2, an explicit early-stream launch and either switch off take the streaming kernel."""
    calls = []
    real = tf.fused_rows_mm
    monkeypatch.setattr(tf, "fused_rows_mm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x, b, nw, _ = _problem("rmsnorm", 2, 70, 300, torch.float16, kernel_device, 3, False)
    want = ref.rmsnorm_gemv(x.double(), nw.double(), b.double(), eps=EPS)
    for m, rows, gemv_rows, got in ((1, True, triton_gemv.ROWS_M1, 1), (2, True, None, 0),
                                    (1, False, triton_gemv.ROWS_M1, 0), (1, True, None, 0)):
        monkeypatch.setattr(tf, "ROWS_M1", rows)
        monkeypatch.setattr(triton_gemv, "ROWS_M1", gemv_rows)
        calls.clear()
        c = tskernels.gemm.rmsnorm_gemv(x[:m], nw, b, eps=EPS, backend="triton")
        assert len(calls) == got
        assert_close(c, want[:m], baseline=ref.rmsnorm_gemv(x[:m], nw, b, eps=EPS),
                     name="rmsnorm_gemv dispatch")


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (7, 100, 300)])
def test_plain_early_stream_gemv(kernel_device, m, n, k, monkeypatch):
    """gemm.gemv's early-stream launch (PRO_NONE: first weight tile before the wait)."""
    x, b, _, r = _problem("rmsnorm", m, n, k, torch.float16, kernel_device, n + k, True)
    for early in (True, False):
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device=kernel_device)
        tf.fused_stream_mm(x, b, out, prologue=tf.PRO_NONE, residual=r, early=early)
        assert_close(out, ref.gemv(x.double(), b.double(), residual=r.double()),
                     baseline=ref.gemv(x, b, residual=r), name=f"plain gemv early={early}")
    if ON_GPU:  # the switch routes the PDL launches (sm_90+) through the early kernel
        monkeypatch.setattr(triton_gemv, "EARLY_STREAM", True)
        c = tskernels.gemm.gemv(x, b, residual=r, backend="triton")
        assert_close(c, out.float(), dtype=torch.float16, name="EARLY_STREAM gemv")


def test_fused_gemv_cpu_reference_and_bad_input():
    """The reference backend (any device), and clear errors naming the argument."""
    x, b, nw, r = _problem("rmsnorm", 3, 8, 16, torch.float32, "cpu", 1, True)
    c = tskernels.gemm.rmsnorm_gemv(x, nw, b, eps=EPS, residual=r)
    want = tskernels.gemm.gemv(tskernels.norm.rmsnorm(x, nw, EPS), b, residual=r)
    torch.testing.assert_close(c, want)
    g = torch.randn(3, 32)
    torch.testing.assert_close(tskernels.gemm.silu_mul_gemv(g, b),
                               tskernels.gemm.gemv(tskernels.activation.silu_and_mul(g), b))
    with pytest.raises(ValueError, match="x: expected an even"):
        tskernels.gemm.silu_mul_gemv(torch.randn(3, 31), b)
    with pytest.raises(ValueError, match="norm_weight"):
        tskernels.gemm.rmsnorm_gemv(x, torch.ones(15), b)
    with pytest.raises(ValueError, match="b"):
        tskernels.gemm.silu_mul_gemv(torch.randn(3, 30), b)
    with pytest.raises(ValueError, match="at most 16 rows"):
        tskernels.gemm.rmsnorm_gemv(torch.randn(17, 16), nw, b)
    with pytest.raises(ValueError, match="eps"):
        tskernels.gemm.rmsnorm_gemv(x, nw, b, eps=0.0)
    with pytest.raises(ValueError, match="residual"):
        tskernels.gemm.rmsnorm_gemv(x, nw, b, residual=torch.randn(3, 9))


# ---- GPU tier: the Llama-3-8B layer chain as serving launches it -----------------------------
LLAMA = dict(hidden=4096, qkv=6144, inter=14336)


def _layer_chain(h, w, fused: bool):
    """One decoder layer's projections on the residual stream h (attention left out: o's
    input is a fixed activation): qkv, o (+res), gate-up, down (+res). Returns (qkv, h)."""
    if fused:
        qkv = tskernels.gemm.rmsnorm_gemv(h, w["ln1"], w["qkv"], eps=EPS, backend="triton")
        h = tskernels.gemm.gemv(w["attn"], w["o"], residual=h, backend="triton")
        gu = tskernels.gemm.rmsnorm_gemv(h, w["ln2"], w["gu"], eps=EPS, backend="triton")
        return qkv, tskernels.gemm.silu_mul_gemv(gu, w["down"], residual=h, backend="triton")
    qkv = tskernels.gemm.gemv(tskernels.norm.rmsnorm(h, w["ln1"], EPS), w["qkv"],
                              backend="triton")
    h = tskernels.gemm.gemv(w["attn"], w["o"], residual=h, backend="triton")
    gu = tskernels.gemm.gemv(tskernels.norm.rmsnorm(h, w["ln2"], EPS), w["gu"],
                             backend="triton")
    return qkv, tskernels.gemm.gemv(tskernels.activation.silu_and_mul(gu), w["down"],
                                    residual=h, backend="triton")


def llama_layer_weights(m: int, dtype=torch.bfloat16, device="cuda", seed=0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    d, q, i = LLAMA["hidden"], LLAMA["qkv"], LLAMA["inter"]

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device=device) * scale).to(dtype)
    return dict(qkv=rnd(q, d, scale=d ** -0.5), o=rnd(d, d, scale=d ** -0.5),
                gu=rnd(2 * i, d, scale=d ** -0.5), down=rnd(d, i, scale=i ** -0.5),
                ln1=(1 + rnd(d, scale=0.1)), ln2=(1 + rnd(d, scale=0.1)), attn=rnd(m, d),
                h=rnd(m, d))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("early", [False, True])
def test_llama_layer_chain_fused_vs_unfused_graph_replay(m, early, monkeypatch):
    """Two layers' chains of PDL launches captured and replayed (outputs NaN-poisoned between
    replays) against eager runs and the unfused chain, with the early streams (fused and
    plain launches) on or off."""
    monkeypatch.setattr(triton_gemv, "EARLY_STREAM", early)
    monkeypatch.setattr(tf, "EARLY_FUSED", early)
    w = llama_layer_weights(m)

    def run():
        qkv, h = _layer_chain(w["h"], w, True)
        return _layer_chain(h, w, True) + (qkv,)
    eager = run()
    unfused = _layer_chain(_layer_chain(w["h"], w, False)[1], w, False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for o, e in zip(outs, eager):
            assert_close(o, e.float(), dtype=torch.bfloat16, name="replay")
    for o, u in zip(outs[:2], unfused):
        assert_close(o, u.float(), dtype=torch.bfloat16, name="fused vs unfused")
    _workspace_clean("cuda")
