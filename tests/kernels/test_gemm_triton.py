"""Triton gemm kernels (mm, gemv, fp8_block_mm) vs the float64 reference: the interpreter on
CPU (fp16: bf16 is garbage there), the real GPU with -m gpu (fp16 and bf16, larger shapes)."""
from __future__ import annotations

import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gemm as ref
from tskernels.numerics import assert_close
from tskernels.ops.gemm import triton_gemv, triton_mm

ON_GPU = torch.cuda.is_available()
DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]
# interpreter problems stay small (it runs every program in Python); the GPU sees real tiles
MAX_MN = 300 if ON_GPU else 90
MAX_K = 1200 if ON_GPU else 300


def _operands(m, n, k, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(device, dtype)
    b = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    return a, b


def _workspace_clean(device) -> None:
    ws, cnt = triton_gemv._workspace(torch.device(device))
    assert int(cnt.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0


@settings(max_examples=12 if not ON_GPU else 24, deadline=None)
@given(m=st.integers(1, MAX_MN), n=st.integers(1, MAX_MN), k=st.integers(1, MAX_K),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_mm_triton(kernel_device, m, n, k, dtype, seed):
    a, b = _operands(m, n, k, dtype, kernel_device, seed)
    c = tskernels.gemm.mm(a, b, backend="triton")
    assert c.dtype == dtype and c.shape == (m, n)
    assert_close(c, ref.mm(a.double(), b.double()), baseline=ref.mm(a, b), name="mm")


@pytest.mark.parametrize("m,n,k", [(70, 104, 96), (33, 64, 64), (129, 40, 200)])
@pytest.mark.parametrize("tma", [False, True])
def test_mm_persistent_both_load_paths(kernel_device, m, n, k, tma):
    """Descriptor (TMA) and pointer loads, forced, with a small config so several tiles and
    grouped rows are walked by each persistent program (TMA needs 16-byte row strides)."""
    if tma and (n * 2) % 16:
        pytest.skip("n * 2 bytes is not a 16-byte row stride (TMA's requirement)")
    a, b = _operands(m, n, k, torch.float16, kernel_device, m + n + k)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=kernel_device)
    if tma and kernel_device == "cuda":
        triton_mm._ensure_allocator()
    cfg = dict(BM=32, BN=32, BK=32, GROUP_M=2, num_stages=2, num_warps=4) \
        if kernel_device == "cpu" else None
    triton_mm.persistent_mm(a, b, out, config=cfg, tma=tma)
    assert_close(out, ref.mm(a.double(), b.double()), baseline=ref.mm(a, b), name="mm")


@settings(max_examples=12 if not ON_GPU else 24, deadline=None)
@given(m=st.integers(1, 16), n=st.integers(1, MAX_MN), k=st.integers(1, 2 * MAX_K),
       dtype=st.sampled_from(DTYPES), residual=st.booleans(),
       out_dtype=st.sampled_from([None, torch.float32]), seed=st.integers(0, 2**31 - 1))
def test_gemv_triton(kernel_device, m, n, k, dtype, residual, out_dtype, seed):
    a, b = _operands(m, n, k, dtype, kernel_device, seed)
    r = torch.randn(m, n, device=kernel_device).to(dtype) if residual else None
    c = tskernels.gemm.gemv(a, b, out_dtype=out_dtype, residual=r, backend="triton")
    want = ref.gemv(a.double(), b.double(), residual=None if r is None else r.double())
    assert_close(c, want, baseline=ref.gemv(a, b, out_dtype=out_dtype, residual=r),
                 name="gemv")
    _workspace_clean(kernel_device)


def test_gemv_split_k_paths(kernel_device):
    """Shapes whose few N tiles make the plan split K (fp32 atomics + last-arrival epilogue),
    repeated so a second call finds the workspace and counters zeroed."""
    m, n, k = 7, 64, 2048
    _, split, _ = triton_gemv.plan(m, n, k, False, torch.device(kernel_device))
    assert split > 1
    a, b = _operands(m, n, k, torch.float16, kernel_device, 3)
    r = torch.randn(m, n, device=kernel_device).half()
    for _ in range(2):
        c = tskernels.gemm.gemv(a, b, residual=r, backend="triton")
        assert_close(c, ref.gemv(a.double(), b.double(), residual=r.double()),
                     baseline=ref.gemv(a, b, residual=r), name="gemv split")
        _workspace_clean(kernel_device)


def test_gemv_non_contiguous_operands(kernel_device):
    a, b = _operands(4, 96, 160, torch.float16, kernel_device, 5)
    at = a.t().contiguous().t()  # column-major view: the backend makes K unit-stride
    c = tskernels.gemm.gemv(at, b[::2], backend="triton")
    assert_close(c, ref.mm(a.double(), b[::2].double()), baseline=ref.mm(a, b[::2]))


@settings(max_examples=10 if not ON_GPU else 16, deadline=None)
@given(m=st.sampled_from([1, 3, 16, 17, 40, 64, 65, 130] if ON_GPU else [1, 3, 17, 64, 65]),
       n=st.integers(1, 3 * 128 if ON_GPU else 200), k=st.integers(1, 1200 if ON_GPU else 300),
       out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_fp8_block_mm_triton(kernel_device, m, n, k, out_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(kernel_device)
    w = (torch.randn(n, k, generator=g) * 0.05).to(kernel_device)
    qa, sa = ref.quantize_fp8_per_token_group(x)
    qb, sb = ref.quantize_fp8_block(w)
    c = tskernels.gemm.fp8_block_mm(qa, sa, qb, sb, out_dtype=out_dtype, backend="triton")
    want = ref.fp8_block_mm(qa, sa.double(), qb, sb.double(), out_dtype=torch.float64)
    # the fp8 operands are exact; Hopper's fp8 MMA adds its products with fewer than fp32's
    # mantissa bits (about 22), so even an fp32 output is held to bf16's bound
    assert_close(c, want, dtype=torch.bfloat16,
                 baseline=ref.fp8_block_mm(qa, sa, qb, sb, out_dtype=out_dtype))
    _workspace_clean(kernel_device)


def test_fp8_block_mm_rejects_other_blocks(kernel_device):
    qa, sa = ref.quantize_fp8_per_token_group(torch.randn(2, 64, device=kernel_device), 64)
    qb, sb = ref.quantize_fp8_block(torch.randn(64, 64, device=kernel_device), 64)
    with pytest.raises(tskernels.SelectionError, match="trait block=64"):
        tskernels.gemm.fp8_block_mm(qa, sa, qb, sb, block=64, backend="triton")


@pytest.mark.gpu
def test_gemv_and_fp8_split_under_cuda_graph_replay(monkeypatch):
    """The split-K launches captured once and replayed: no host sync, workspace re-zeroed by
    the kernels themselves between replays (M = 1 kept off the rows kernel)."""
    monkeypatch.setattr(triton_gemv, "ROWS_M1", None)
    dev = "cuda"
    a, b = _operands(1, 1024, 4096, torch.bfloat16, dev, 11)
    r = torch.randn(1, 1024, device=dev).bfloat16()
    qa, sa = ref.quantize_fp8_per_token_group(torch.randn(8, 2048, device=dev))
    qb, sb = ref.quantize_fp8_block(torch.randn(2112, 2048, device=dev) * 0.05)
    gemv = lambda: tskernels.gemm.gemv(a, b, residual=r, backend="triton")  # noqa: E731
    fp8 = lambda: tskernels.gemm.fp8_block_mm(qa, sa, qb, sb, backend="triton")  # noqa: E731
    c1, c2 = gemv(), fp8()  # compile + workspace outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g1, g2 = gemv(), fp8()
    for _ in range(3):
        g1.fill_(float("nan"))
        g2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(g1, c1.float(), dtype=torch.bfloat16, name="gemv replay")
        assert_close(g2, c2.float(), dtype=torch.bfloat16, name="fp8 replay")
    _workspace_clean(dev)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 7168, 2048), (300, 2112, 1536), (1000, 384, 1024)])
@pytest.mark.parametrize("cfg", [
    dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=3, num_warps=4, CTAS_PER_SM=2),
    dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=4, num_warps=4, CTAS_PER_SM=2),
    dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=4, num_warps=4)])
def test_fp8_persistent_candidate_configs(m, n, k, cfg):
    """The persistent block-fp8 kernel at the configs benchmarks/gemm_decode_ab.py times
    (64-row tiles, one or two CTAs per SM) vs the reference."""
    g = torch.Generator().manual_seed(m + n)
    qa, sa = ref.quantize_fp8_per_token_group((torch.randn(m, k, generator=g) * 3).cuda())
    qb, sb = ref.quantize_fp8_block((torch.randn(n, k, generator=g) * 0.05).cuda())
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    triton_mm.persistent_mm(qa, qb, out, a_scale=sa, b_scale=sb, config=cfg)
    want = ref.fp8_block_mm(qa, sa.double(), qb, sb.double(), out_dtype=torch.float64)
    assert_close(out, want, dtype=torch.bfloat16,
                 baseline=ref.fp8_block_mm(qa, sa, qb, sb, out_dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_gemv_with_and_without_pdl(pdl, monkeypatch):
    """Back-to-back split / unsplit gemv launches (each a programmatic dependent of the last
    when pdl) under graph replay give the eager results."""
    monkeypatch.setattr(triton_gemv, "USE_PDL", pdl)
    dev = "cuda"
    shapes = [(1, 4096, 4096), (1, 6144, 4096), (16, 28672, 4096), (1, 4096, 14336)]
    ops = [_operands(m, n, k, torch.bfloat16, dev, n + k) for m, n, k in shapes]
    r = torch.randn(1, 4096, device=dev).bfloat16()
    calls = [lambda a=a, b=b: tskernels.gemm.gemv(a, b, backend="triton") for a, b in ops]
    calls.append(lambda: tskernels.gemm.gemv(ops[0][0], ops[0][1], residual=r,
                                             backend="triton"))
    eager = [c() for c in calls]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [c() for c in calls]
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for o, e, (a, b) in zip(outs, eager, ops + [ops[0]]):
            assert_close(o, e.float(), dtype=torch.bfloat16, name="replay")
    want = ref.mm(ops[1][0].double(), ops[1][1].double())
    assert_close(eager[1], want)
    _workspace_clean(dev)


@pytest.mark.parametrize("m,n,k", [(1, 96, 512), (3, 70, 300)])
def test_gemv_early_stream_prefetch(kernel_device, monkeypatch, m, n, k):
    """PREFETCH_TILES > 0: the 16-bit launches go through _stream_early_kernel (on sm_90+ a
    PDL launch that asks L2 for its first weight tiles before its wait; the interpreter runs
    the wrapper without PDL), split and not, residual or not: the plain launch's results and
    a clean workspace."""
    monkeypatch.setattr(triton_gemv, "PREFETCH_TILES", 4)
    a, b = _operands(m, n, k, torch.float16, kernel_device, m + n)
    r = torch.randn(m, n).to(kernel_device, torch.float16)
    for res in (None, r):
        c = tskernels.gemm.gemv(a, b, residual=res, backend="triton")
        want = ref.gemv(a.double(), b.double(), residual=None if res is None else r.double())
        assert_close(c, want, baseline=ref.gemv(a, b, residual=res), name="early gemv")
    _workspace_clean(kernel_device)


def test_gemv_per_shape_configs(kernel_device, monkeypatch):
    """SHAPE_CONFIGS replaces the config and the programs-per-SM target of one (N, K) (16-bit,
    M <= 16) and leaves other shapes, fp8 and explicit configs alone; results stay right."""
    cfg = dict(BN=32, BK=64, num_stages=2, num_warps=4)
    monkeypatch.setattr(triton_gemv, "SHAPE_CONFIGS", {(96, 256): (cfg, 8)})
    dev = torch.device(kernel_device)
    got, split, _ = triton_gemv.plan(1, 96, 256, False, dev)
    assert got == cfg and split == min(4, round(8 * triton_gemv._num_sms(dev) / 3))
    assert triton_gemv.plan(1, 128, 256, False, dev)[0] != cfg
    assert triton_gemv.plan(1, 96, 256, True, dev)[0] != cfg
    assert triton_gemv.plan(1, 96, 256, False, dev, dict(cfg, BN=16))[0]["BN"] == 16
    a, b = _operands(2, 96, 256, torch.float16, kernel_device, 3)
    c = tskernels.gemm.gemv(a, b, backend="triton")
    assert_close(c, ref.mm(a.double(), b.double()), baseline=ref.mm(a, b))
    _workspace_clean(kernel_device)


@pytest.mark.skipif(ON_GPU, reason="the AMD launch options are not CUDA's: the CPU tier runs the "
                                   "CDNA configs under the interpreter")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gemv_cdna_configs(arch, monkeypatch):
    """The gfx942 / gfx950 streaming configs (their tiles and MFMA option, as a CDNA device
    launches them), split and not, give the float64 product; a CDNA device skips the H200
    per-shape configs."""
    from tskernels.ops.gemm import _tune

    cfg = triton_gemv.CDNA_STREAM_CONFIGS[arch]
    for m, n, k in ((3, 64, 2048), (16, 200, 384)):
        a, b = _operands(m, n, k, torch.float16, "cpu", 5)
        r = torch.randn(m, n).half()
        out = torch.empty(m, n, dtype=torch.float16)
        triton_gemv.stream_mm(a, b, out, residual=r, config=cfg)
        assert_close(out, ref.gemv(a.double(), b.double(), residual=r.double()),
                     baseline=ref.gemv(a, b, residual=r), name=f"gemv {arch} {m}x{n}x{k}")
        _workspace_clean("cpu")
    monkeypatch.setattr(_tune, "cdna_arch", lambda device: arch)
    monkeypatch.setattr(triton_gemv, "SHAPE_CONFIGS", {(96, 256): (dict(cfg, BN=32), 8)})
    assert triton_gemv.plan(1, 96, 256, False, torch.device("cpu"))[0]["BN"] != 32


def _decode_layer(dev, hidden=1024, heads=8, kv_heads=2, inter=2048, seq=300, seed=0):
    """One decode layer's launches at B = 1, as serve.models.layers runs them unfused:
    add + RMSNorm, qkv gemv, RoPE, K/V store, split-KV decode (+ merge), o gemv, add + RMSNorm,
    gate-up gemv, SiLU-mul, down gemv. Returns (run, buffers the run writes)."""
    g = torch.Generator().manual_seed(seed)
    d = 128

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dev, torch.bfloat16)
    w = dict(qkv=rnd((heads + 2 * kv_heads) * d, hidden, scale=hidden ** -0.5),
             o=rnd(hidden, heads * d, scale=(heads * d) ** -0.5),
             gu=rnd(2 * inter, hidden, scale=hidden ** -0.5),
             down=rnd(hidden, inter, scale=inter ** -0.5),
             ln1=1 + rnd(hidden, scale=0.1), ln2=1 + rnd(hidden, scale=0.1))
    x, res = rnd(1, hidden), rnd(1, hidden)
    pages = seq // 16 + 2
    kc, vc = rnd(pages, 16, kv_heads, d), rnd(pages, 16, kv_heads, d)
    page_table = torch.randperm(pages, generator=g)[None].to(dev, torch.int32)
    seq_lens = torch.tensor([seq], dtype=torch.int32, device=dev)
    pt = page_table[0].long()
    slot = (pt[(seq - 1) // 16] * 16 + (seq - 1) % 16).view(1)
    pos = torch.tensor([seq - 1], device=dev)
    cache = tskernels.rope.cos_sin_cache(4096, d, 500000.0, device=dev)
    plan = tskernels.attention.decode_plan(page_table, seq_lens, num_q_heads=heads,
                                           k_cache=kc, max_seq_len=4096, num_splits=8)
    gemv = tskernels.gemm.gemv

    def run():
        h, r = tskernels.norm.fused_add_rmsnorm(x, res, w["ln1"])
        qkv = gemv(h, w["qkv"])
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k = tskernels.rope.apply_rope(q.view(1, heads, d), k.view(1, kv_heads, d), pos,
                                         cache)
        tskernels.attention.store_kv(k, v.view(1, kv_heads, d), kc, vc, slot)
        o = gemv(plan.run(q, kc, vc).view(1, -1), w["o"])
        h, r = tskernels.norm.fused_add_rmsnorm(o, r, w["ln2"])
        out = gemv(tskernels.activation.silu_and_mul(gemv(h, w["gu"])), w["down"], residual=r)
        return out, kc
    return run


@pytest.mark.gpu
def test_decode_layer_chained_with_prefetch_under_graph_replay(monkeypatch):
    """The B = 1 decode layer with every kernel chained (shared/pdl.CHAIN: each a programmatic
    dependent that triggers its own dependents at start), the gemvs prefetching weights
    before their wait and RoPE in one launch, captured in a CUDA graph: each replay (outputs
    poisoned with NaN first) equals the plain eager launches, and the split workspace is
    clean afterwards."""
    from tskernels.ops.rope import triton as rope_triton
    from tskernels.ops.shared import pdl
    run = _decode_layer("cuda")
    want, kc_want = (t.clone() for t in run())
    monkeypatch.setattr(pdl, "CHAIN", frozenset(pdl.NAMES))
    monkeypatch.setattr(triton_gemv, "PREFETCH_TILES", 4)
    monkeypatch.setattr(rope_triton, "ONE_LAUNCH", True)
    run()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, kc = run()
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, want.float(), dtype=torch.bfloat16, name="layer output")
        assert torch.equal(kc, kc_want)
    _workspace_clean("cuda")


@settings(max_examples=10 if not ON_GPU else 24, deadline=None)
@given(n=st.integers(1, MAX_MN), k=st.integers(1, 2 * MAX_K), bn=st.sampled_from([2, 4, 8]),
       bk=st.sampled_from([64, 256, 2048]), residual=st.booleans(),
       out_dtype=st.sampled_from([torch.float16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_gemv_rows_kernel(kernel_device, n, k, bn, bk, residual, out_dtype, seed):
    """The CUDA-core rows kernel (M = 1, whole rows per program, no split) for any N, K (K not
    a multiple of BK: masked tail; BK above K: capped), residual or not, into a NaN-poisoned
    output; on sm_90+ a PDL launch with one tile prefetched before its wait."""
    a, b = _operands(1, n, k, torch.float16, kernel_device, seed)
    r = torch.randn(1, n).to(kernel_device, torch.float16) if residual else None
    out = torch.full((1, n), float("nan"), dtype=out_dtype, device=kernel_device)
    triton_gemv.rows_mm(a, b, out, residual=r,
                        config=dict(BN=bn, BK=bk, num_warps=4, PREFETCH=1))
    want = ref.gemv(a.double(), b.double(), residual=None if r is None else r.double())
    assert_close(out, want, baseline=ref.gemv(a, b, out_dtype=out_dtype, residual=r),
                 name="gemv rows")


@settings(max_examples=10 if not ON_GPU else 24, deadline=None)
@given(n=st.integers(1, MAX_MN), k=st.integers(1, 2 * MAX_K), bn=st.sampled_from([2, 4, 8]),
       bk=st.sampled_from([64, 256, 2048]), per_sm=st.sampled_from([None, 1, 2, 5]),
       residual=st.booleans(), out_dtype=st.sampled_from([torch.float16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_gemv_rows_persistent_kernel(kernel_device, n, k, bn, bk, per_sm, residual, out_dtype,
                                     seed):
    """The persistent rows kernel (PERSIST: as many programs as fit resident, or PER_SM per
    SM, each walking several row blocks with the next tile loaded ahead) for any N, K (masked
    K tail, BK capped at K), residual or not, into a NaN-poisoned output; on sm_90+ a PDL
    launch whose first weight tile is loaded before its wait. Under the interpreter 4-8
    programs, so most draws give each program several blocks."""
    a, b = _operands(1, n, k, torch.float16, kernel_device, seed)
    r = torch.randn(1, n).to(kernel_device, torch.float16) if residual else None
    out = torch.full((1, n), float("nan"), dtype=out_dtype, device=kernel_device)
    cfg = dict(BN=bn, BK=bk, num_warps=4, PERSIST=True)
    if per_sm is not None:
        cfg["PER_SM"] = per_sm
    triton_gemv.rows_mm(a, b, out, residual=r, config=cfg)
    want = ref.gemv(a.double(), b.double(), residual=None if r is None else r.double())
    assert_close(out, want, baseline=ref.gemv(a, b, out_dtype=out_dtype, residual=r),
                 name="gemv rows persistent")


def test_gemv_m1_takes_the_rows_kernel(kernel_device, monkeypatch):
    """M = 1 16-bit calls go to the rows kernel (ROWS_SHAPE_CONFIGS's config for their (N, K),
    else the persistent form up to PERSIST_MAX_BYTES of weight, else ROWS_M1) unless the
    switch is off; M = 2 does not; every path gives the product."""
    calls = []
    real = triton_gemv.rows_mm
    monkeypatch.setattr(triton_gemv, "rows_mm",
                        lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw))
    shape_cfg = dict(BN=2, BK=64, num_warps=4)
    monkeypatch.setattr(triton_gemv, "ROWS_SHAPE_CONFIGS", {(70, 300): shape_cfg})
    a, b = _operands(2, 70, 300, torch.float16, kernel_device, 9)
    want = ref.mm(a.double(), b.double())
    persist = triton_gemv.rows_config(69, 300, 2)
    assert persist["PERSIST"] and persist["BK"] == 256 and persist["BN"] == 16
    for m, w, switch, persist_max, got in (
            (1, b, triton_gemv.ROWS_M1, None, [shape_cfg]),
            (1, b[:69], triton_gemv.ROWS_M1, None, [persist]),  # small weight: persistent
            (1, b[:69], triton_gemv.ROWS_M1, 69 * 300 * 2 - 1, [triton_gemv.ROWS_M1]),
            (2, b, triton_gemv.ROWS_M1, None, []), (1, b, None, None, [])):
        monkeypatch.setattr(triton_gemv, "ROWS_M1", switch)
        if persist_max is not None:
            monkeypatch.setattr(triton_gemv, "PERSIST_MAX_BYTES", persist_max)
        calls.clear()
        c = tskernels.gemm.gemv(a[:m], w, backend="triton")
        assert calls == got
        assert_close(c, want[:m, :w.shape[0]], baseline=ref.mm(a[:m], w), name="gemv dispatch")
    monkeypatch.setattr(triton_gemv, "ROWS_PERSIST", None)  # off: the plain rows kernel
    monkeypatch.setattr(triton_gemv, "ROWS_M1", triton_gemv.ROWS_DEFAULT)
    assert triton_gemv.rows_config(69, 300, 2) is triton_gemv.ROWS_DEFAULT
    _workspace_clean(kernel_device)


@settings(max_examples=10 if not ON_GPU else 24, deadline=None)
@given(m=st.integers(1, 16), n=st.integers(1, MAX_MN), k=st.integers(1, 2 * MAX_K),
       bn=st.sampled_from([16, 32, 64]), bk=st.sampled_from([64, 128]),
       stages=st.sampled_from([2, 3, 4]), split=st.sampled_from([None, 1, 2, 4]),
       per_sm=st.sampled_from([None, 1, 2]), residual=st.booleans(),
       out_dtype=st.sampled_from([torch.float16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_gemv_dot_persistent_kernel(kernel_device, m, n, k, bn, bk, stages, split, per_sm,
                                    residual, out_dtype, seed):
    """The persistent tensor-core kernel (resident programs walking (row block, K range)
    units as one pipelined loop) for 1-16 rows, any N, K (masked K tail), SPLIT from dot_split
    or forced (a SPLIT that does not divide the K tiles falls back to 1), PER_SM, residual or
    not, into a NaN-poisoned output; the split workspace and counters are clean after."""
    a, b = _operands(m, n, k, torch.float16, kernel_device, seed)
    r = torch.randn(m, n).to(kernel_device, torch.float16) if residual else None
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=kernel_device)
    cfg = dict(BN=bn, BK=bk, num_stages=stages, num_warps=4, PREFETCH=1)
    cfg.update({"SPLIT": split} if split else {}, **({"PER_SM": per_sm} if per_sm else {}))
    triton_gemv.dot_persist_mm(a, b, out, residual=r, config=cfg)
    want = ref.gemv(a.double(), b.double(), residual=None if r is None else r.double())
    assert_close(out, want, baseline=ref.gemv(a, b, out_dtype=out_dtype, residual=r),
                 name="gemv dot persistent")
    _workspace_clean(kernel_device)


@settings(max_examples=8 if not ON_GPU else 16, deadline=None)
@given(m=st.sampled_from([1, 3, 16, 17, 40, 64] if ON_GPU else [1, 3, 17, 64]),
       n=st.integers(1, 3 * 128 if ON_GPU else 200), k=st.integers(1, 1200 if ON_GPU else 300),
       bn=st.sampled_from([32, 64, 128]), split=st.sampled_from([None, 1, 2]),
       pdl=st.booleans(), out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
def test_fp8_dot_persistent_kernel(kernel_device, m, n, k, bn, split, pdl, out_dtype, seed):
    """The persistent tensor-core kernel on block-fp8 operands (1 x 128 activation groups,
    128 x 128 weight blocks; BN 32 / 64 / 128 share a weight block's scale row) at 1-64 rows,
    as a programmatic dependent launch or not (sm_90+)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(kernel_device)
    w = (torch.randn(n, k, generator=g) * 0.05).to(kernel_device)
    qa, sa = ref.quantize_fp8_per_token_group(x)
    qb, sb = ref.quantize_fp8_block(w)
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=kernel_device)
    cfg = dict(BN=bn, BK=128, num_stages=3, num_warps=4, **({"SPLIT": split} if split else {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_gemv, "FP8_PERSIST_PDL", pdl)
        triton_gemv.dot_persist_mm(qa, qb, out, x_scale=sa, w_scale=sb, config=cfg)
    want = ref.fp8_block_mm(qa, sa.double(), qb, sb.double(), out_dtype=torch.float64)
    assert_close(out, want, dtype=torch.bfloat16,
                 baseline=ref.fp8_block_mm(qa, sa, qb, sb, out_dtype=out_dtype))
    _workspace_clean(kernel_device)
    with pytest.raises(ValueError, match="block == BK"):
        triton_gemv.dot_persist_mm(qa, qb, out, x_scale=sa, w_scale=sb,
                                   config=dict(cfg, BK=64))


def test_dot_split_rule():
    """dot_split: the divisor of the K tiles that gives the busiest program the fewest tiles
    (a split unit costing half a tile more), 1 when the row blocks alone fill the programs."""
    assert triton_gemv.dot_split(64, 32, 264) == 4     # 4096 x 4096, BN 64: 256 units of 8
    assert triton_gemv.dot_split(96, 32, 264) == 8     # 6144 x 4096: 768 units of 4 (3 each)
    assert triton_gemv.dot_split(448, 32, 264) == 4    # 28672 x 4096: 7 units of 8, not 2 of 32
    assert triton_gemv.dot_split(528, 32, 264) == 1    # two whole blocks for every program
    assert triton_gemv.dot_split(64, 112, 264) == 4    # 4096 x 14336
    for nb, kt, cap in ((1, 7, 4), (3, 12, 132), (500, 1, 264), (2, 128, 396)):
        s = triton_gemv.dot_split(nb, kt, cap)
        assert kt % s == 0 and 1 <= s <= kt


def test_stream_mm_takes_the_dot_persistent_kernel(kernel_device, monkeypatch):
    """dot_config's rule: 16-bit calls of 2-16 rows with N <= DOT_16BIT_MAX_N and fp8 calls
    of 2-64 rows within DOT_FP8_MAX_BYTES take dot_persist_mm (M = 1 keeps the rows / split
    kernels, larger weights the split kernel); an explicit config or a switch set to None
    keeps the split kernel; every path gives the product."""
    calls = []
    real = triton_gemv.dot_persist_mm
    monkeypatch.setattr(triton_gemv, "dot_persist_mm",
                        lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw))
    dot = dict(BN=32, BK=64, num_stages=2, num_warps=4)
    monkeypatch.setattr(triton_gemv, "DOT_16BIT", dot)
    monkeypatch.setattr(triton_gemv, "DOT_16BIT_MAX_N", 70)
    a, b = _operands(16, 71, 300, torch.float16, kernel_device, 5)
    want = ref.mm(a.double(), b.double())
    for m, n, got in ((1, 70, []), (2, 70, [dot]), (16, 70, [dot]), (16, 71, [])):
        calls.clear()
        c = tskernels.gemm.gemv(a[:m], b[:n], backend="triton")
        assert calls == got
        assert_close(c, want[:m, :n], baseline=ref.mm(a[:m], b[:n]), name="gemv dispatch")
    calls.clear()
    out = torch.empty(4, 70, dtype=torch.float16, device=kernel_device)
    triton_gemv.stream_mm(a[:4], b[:70], out, config=triton_gemv.STREAM_CONFIGS[("16bit", 16)])
    assert calls == []
    monkeypatch.setattr(triton_gemv, "DOT_16BIT", None)
    tskernels.gemm.gemv(a[:4], b[:70], backend="triton")
    assert calls == []
    fp8 = dict(BN=64, BK=128, num_stages=3, num_warps=4)
    monkeypatch.setattr(triton_gemv, "DOT_FP8", fp8)
    monkeypatch.setattr(triton_gemv, "DOT_FP8_MAX_BYTES", 96 * 256)
    qa, sa = ref.quantize_fp8_per_token_group(torch.randn(40, 256, device=kernel_device))
    qb, sb = ref.quantize_fp8_block(torch.randn(97, 256, device=kernel_device) * 0.05)
    for m, n, got in ((40, 96, [fp8]), (1, 96, []), (40, 97, [])):
        calls.clear()
        c = tskernels.gemm.fp8_block_mm(qa[:m], sa[:m], qb[:n], sb[:triton.cdiv(n, 128)],
                                        backend="triton")
        assert calls == got
        want8 = ref.fp8_block_mm(qa[:m], sa[:m].double(), qb[:n],
                                 sb[:triton.cdiv(n, 128)].double(), out_dtype=torch.float64)
        assert_close(c, want8, dtype=torch.bfloat16,
                     baseline=ref.fp8_block_mm(qa[:m], sa[:m], qb[:n], sb[:triton.cdiv(n, 128)]))
    _workspace_clean(kernel_device)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_dot_persistent_under_cuda_graph_replay(pdl, monkeypatch):
    """Back-to-back persistent tensor-core launches (16-bit at 2 / 16 rows, split and not,
    and block-fp8 at 1 / 64 rows), each a programmatic dependent of the last when pdl, under
    graph replay give the eager results; the workspace is clean after."""
    monkeypatch.setattr(triton_gemv, "USE_PDL", pdl)
    monkeypatch.setattr(triton_gemv, "FP8_PERSIST_PDL", pdl)
    monkeypatch.setattr(triton_gemv, "DOT_16BIT", dict(BN=64, BK=128, num_stages=4,
                                                       num_warps=4))
    monkeypatch.setattr(triton_gemv, "DOT_FP8", dict(BN=64, BK=128, num_stages=4,
                                                     num_warps=4))
    dev = "cuda"
    ops = [_operands(m, n, k, torch.bfloat16, dev, n + k + m)
           for m, n, k in ((2, 4096, 4096), (16, 6144, 4096), (16, 28672, 4096))]
    r = torch.randn(2, 4096, device=dev).bfloat16()
    fp8 = []
    for m, n, k in ((1, 7168, 2048), (64, 2112, 7168)):
        qa, sa = ref.quantize_fp8_per_token_group(torch.randn(m, k, device=dev))
        qb, sb = ref.quantize_fp8_block(torch.randn(n, k, device=dev) * 0.05)
        fp8.append((qa, sa, qb, sb))
    calls = [lambda a=a, b=b: tskernels.gemm.gemv(a, b, backend="triton") for a, b in ops]
    calls.append(lambda: tskernels.gemm.gemv(ops[0][0], ops[0][1], residual=r,
                                             backend="triton"))
    calls += [lambda q=q: tskernels.gemm.fp8_block_mm(*q, backend="triton") for q in fp8]
    eager = [c() for c in calls]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [c() for c in calls]
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for o, e in zip(outs, eager):
            assert_close(o, e.float(), dtype=torch.bfloat16, name="replay")
    for (a, b), e in zip(ops, eager):
        assert_close(e, ref.mm(a.double(), b.double()), baseline=ref.mm(a, b))
    for q, e in zip(fp8, eager[len(ops) + 1:]):
        assert_close(e, ref.fp8_block_mm(q[0], q[1].double(), q[2], q[3].double(),
                                         out_dtype=torch.float64),
                     dtype=torch.bfloat16, baseline=ref.fp8_block_mm(*q))
    _workspace_clean(dev)
