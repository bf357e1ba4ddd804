"""Triton gated delta rule (chunked prefill, decode step) vs the token-by-token recurrence in
float64: ragged batches with empty and one-token sequences, grouped value heads, initial
states, prefill split in pieces, NaN-poisoned unused state slots. Interpreter on CPU, the real
GPU with -m gpu (larger shapes there)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
import tskernels_ref.gdn as ref
from tskernels.numerics import assert_close

from ..conftest import HAS_CUDA

gdn = tskernels.gdn
# Each distinct (heads, dims, dtype) compiles its kernels once on the GPU: keep the set small.
DTYPES = [torch.float32, torch.bfloat16] if HAS_CUDA else [torch.float32, torch.float16]
DIMS = [(16, 32), (128, 128)] if HAS_CUDA else [(16, 16), (16, 32)]
KEY_HEADS = [2] if HAS_CUDA else [1, 2]
MAX_LEN = 300 if HAS_CUDA else 140
EXAMPLES = 30 if HAS_CUDA else 10


def recurrence(q, k, v, g, beta, state, scale, l2):
    """One sequence, float64, token by token: q, k [L, HK, K]; v [L, H, V]; state [H, K, V]."""
    q, k, v, g, beta = (x.double().cpu() for x in (q, k, v, g, beta))
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = v.shape[1] // q.shape[1]
    state = state.double().cpu().clone()
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(v.shape[1]):
            kt, qt = k[t, h // group], q[t, h // group]
            s = state[h] * math.exp(float(g[t, h]))
            s = s + float(beta[t, h]) * torch.outer(kt, v[t, h] - s.T @ kt)
            out[t, h] = s.T @ (qt * scale)
            state[h] = s
    return out, state


def problem(lens, hk, group, dk, dv, dtype, device, seed, l2=True):
    gen = torch.Generator().manual_seed(seed)
    total, hv = sum(lens), hk * group
    q = torch.randn(total, hk, dk, generator=gen)
    k = torch.randn(total, hk, dk, generator=gen)
    if not l2:  # unit keys keep the delta rule contractive, as the models' L2 norm does
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(total, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(total, hv, generator=gen) + 2)
    beta = torch.rand(total, hv, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()],
                      dtype=torch.int32)
    to = lambda x: x.to(device, dtype)  # noqa: E731
    return dict(q=to(q), k=to(k), v=to(v), g=g.to(device), beta=to(beta),
                cu_seqlens=cu.to(device))


def check_prefill(x, o, final, init, scale, l2, name=""):
    bounds = x["cu_seqlens"].tolist()
    dtype = x["q"].dtype
    want_o = torch.zeros(o.shape, dtype=torch.float64)
    want_s = torch.zeros(final.shape, dtype=torch.float64)
    for n in range(len(bounds) - 1):
        s, e = bounds[n], bounds[n + 1]
        start = init[n] if init is not None else torch.zeros(final.shape[1:])
        want_o[s:e], want_s[n] = recurrence(*(x[a][s:e] for a in ("q", "k", "v", "g", "beta")),
                                            start, scale, l2)
    assert_close(o, want_o, dtype, name=f"{name}o")
    assert_close(final, want_s, dtype, name=f"{name}final_state")


@settings(max_examples=EXAMPLES)
@given(lens=st.lists(st.one_of(st.sampled_from([0, 1, 64, 65]), st.integers(0, MAX_LEN)),
                     min_size=1, max_size=4),
       hk=st.sampled_from(KEY_HEADS), group=st.sampled_from([1, 2]),
       dims=st.sampled_from(DIMS), dtype=st.sampled_from(DTYPES), with_state=st.booleans(), l2=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_chunk_prefill_matches_recurrence(kernel_device, lens, hk, group, dims, dtype,
                                          with_state, l2, seed):
    x = problem(lens, hk, group, *dims, dtype, kernel_device, seed, l2)
    hv = hk * group
    init = (torch.randn(len(lens), hv, *dims, generator=torch.Generator().manual_seed(seed)) * 0.5
            if with_state else None)
    o, final = gdn.chunk_prefill(**x, initial_state=None if init is None else
                                 init.to(kernel_device), scale=0.3, use_qk_l2norm=l2,
                                 backend="triton")
    assert o.dtype == dtype and final.dtype == torch.float32
    check_prefill(x, o, final, init, 0.3, l2)


@settings(max_examples=EXAMPLES)
@given(lens=st.lists(st.integers(0, MAX_LEN), min_size=1, max_size=3),
       cut=st.floats(0, 1), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_prefill_in_pieces_equals_one_prefill(kernel_device, lens, cut, dtype, seed):
    """State carried across prefill chunks (any split point, also inside a 64-token chunk)."""
    dk, dv = DIMS[-1]
    x = problem(lens, 2, 2, dk, dv, dtype, kernel_device, seed)
    one_o, one_s = gdn.chunk_prefill(**x, use_qk_l2norm=True, backend="triton")
    first = [int(n * cut) for n in lens]
    bounds = x["cu_seqlens"].tolist()
    pieces = [[], []]
    for n, f in enumerate(first):
        pieces[0].append(torch.arange(bounds[n], bounds[n] + f))
        pieces[1].append(torch.arange(bounds[n] + f, bounds[n + 1]))
    state, outs = None, []
    for part, part_lens in zip(pieces, (first, [n - f for n, f in zip(lens, first)])):
        idx = torch.cat(part).to(kernel_device)
        sub = {a: x[a][idx] for a in ("q", "k", "v", "g", "beta")}
        cu = torch.tensor([0, *torch.tensor(part_lens).cumsum(0).tolist()], dtype=torch.int32)
        o, state = gdn.chunk_prefill(**sub, cu_seqlens=cu.to(kernel_device), initial_state=state,
                                     use_qk_l2norm=True, backend="triton")
        outs.append((idx, o))
    got = torch.empty_like(one_o)
    for idx, o in outs:
        got[idx] = o
    assert_close(got, one_o.double(), dtype, name="pieces o")
    assert_close(state, one_s.double(), dtype, name="pieces state")


def poisoned_pool(num_slots, hv, dk, dv, used, device, gen):
    """A state pool whose slots not in `used` hold NaN (a kernel touching them shows)."""
    pool = torch.full((num_slots, hv, dk, dv), float("nan"))
    pool[used] = torch.randn(len(used), hv, dk, dv, generator=gen) * 0.5
    return pool.to(device)


@settings(max_examples=EXAMPLES)
@given(batch=st.integers(1, 9), hk=st.sampled_from(KEY_HEADS), group=st.sampled_from([1, 2]),
       dims=st.sampled_from(DIMS), dtype=st.sampled_from(DTYPES), l2=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_decode_step_slots(kernel_device, batch, hk, group, dims, dtype, l2, seed):
    gen = torch.Generator().manual_seed(seed)
    x = problem([1] * batch, hk, group, *dims, dtype, kernel_device, seed, l2)
    del x["cu_seqlens"]
    num_slots = batch + 4
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    pool = poisoned_pool(num_slots, hk * group, *dims, slots.tolist(), kernel_device, gen)
    before = pool.cpu().clone()
    o = gdn.decode_step(**x, state=pool, state_slots=slots.to(kernel_device, torch.int32),
                        use_qk_l2norm=l2, backend="triton")
    scale = dims[0] ** -0.5
    want_o = torch.zeros(o.shape, dtype=torch.float64)
    for b, slot in enumerate(slots.tolist()):
        want_o[b: b + 1], want_s = recurrence(*(x[a][b: b + 1] for a in ("q", "k", "v", "g",
                                                                         "beta")),
                                              before[slot], scale, l2)
        assert_close(pool[slot], want_s, dtype, name=f"state slot {slot}")
    assert_close(o, want_o, dtype, name="decode o")
    unused = [s for s in range(num_slots) if s not in slots.tolist()]
    assert torch.isnan(pool[unused]).all(), "an unused (NaN) slot was written"


def test_decode_continues_prefill(kernel_device):
    dk, dv = DIMS[-1]
    x = problem([41, 7], 2, 2, dk, dv, DTYPES[0], kernel_device, 5)
    one_o, one_s = gdn.chunk_prefill(**x, use_qk_l2norm=True, backend="triton")
    last = torch.tensor([40, 47], device=kernel_device)
    keep = torch.ones(48, dtype=torch.bool)
    keep[[40, 47]] = False
    pre = {a: x[a][keep.to(kernel_device)] for a in ("q", "k", "v", "g", "beta")}
    cu = torch.tensor([0, 40, 46], dtype=torch.int32, device=kernel_device)
    _, state = gdn.chunk_prefill(**pre, cu_seqlens=cu, use_qk_l2norm=True, backend="triton")
    pool = torch.full((5, *state.shape[1:]), float("nan"), device=kernel_device)
    pool[[3, 0]] = state
    o = gdn.decode_step(*(x[a][last] for a in ("q", "k", "v", "g", "beta")), pool,
                        torch.tensor([3, 0], dtype=torch.int32, device=kernel_device),
                        use_qk_l2norm=True, backend="triton")
    assert_close(o, one_o[last].double(), name="decode after prefill")
    assert_close(pool[[3, 0]], one_s.double(), name="state after decode")


def test_triton_matches_reference_module_on_chunked_form(kernel_device):
    """The kernel and tskernels_ref's chunked form agree on one mid-size problem."""
    dk, dv = DIMS[-1]
    x = problem([130, 0, 1, 77], 2, 2, dk, dv, torch.float32, kernel_device, 9)
    o, s = gdn.chunk_prefill(**x, use_qk_l2norm=True, backend="triton")
    ro, rs = ref.chunk_prefill(*(x[a].cpu().double() for a in ("q", "k", "v", "g", "beta")),
                               cu_seqlens=x["cu_seqlens"].cpu(), use_qk_l2norm=True)
    assert_close(o, ro, name="o")
    assert_close(s, rs, name="final_state")


def _triton(op):
    return next(k for k in tskernels.kernels("gdn", op) if k.backend == "triton")


VARIANT_DIMS = (128, 128) if HAS_CUDA else (16, 64)


@pytest.mark.parametrize("block_v", [16, 32, 64])
def test_decode_block_widths(kernel_device, block_v):
    """Every value-block width the decode launch may pick (the H200 sweep measured 64 fastest
    from B = 64 on) gives the recurrence's values and leaves unused slots alone."""
    gen = torch.Generator().manual_seed(block_v)
    x = problem([1] * 3, 2, 2, *VARIANT_DIMS, DTYPES[0], kernel_device, block_v)
    pool = poisoned_pool(6, 4, *VARIANT_DIMS, [4, 0, 2], kernel_device, gen)
    before = pool.cpu().clone()
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=kernel_device)
    o = _triton("decode_step").fn(*(x[a] for a in ("q", "k", "v", "g", "beta")), pool, slots,
                                  use_qk_l2norm=True, block_v=block_v)
    for b, slot in enumerate([4, 0, 2]):
        want_o, want_s = recurrence(*(x[a][b: b + 1] for a in ("q", "k", "v", "g", "beta")),
                                    before[slot], VARIANT_DIMS[0] ** -0.5, True)
        assert_close(o[b: b + 1], want_o, name=f"o[{b}]")
        assert_close(pool[slot], want_s, name=f"slot {slot}")
    assert torch.isnan(pool[[1, 3, 5]]).all()


# options that only change num_warps / num_stages run the default's code under the interpreter
# (it ignores both): on the CPU tier they would repeat the default's test, so they run on a GPU
_LAUNCH_ONLY = pytest.mark.skipif(not HAS_CUDA, reason="warps / stages only: the interpreter "
                                  "runs the default's code (tested); the GPU tier runs these")


@pytest.mark.parametrize("tuning", [
    {"state_bv": 16}, {"state_bv": 64}, pytest.param({"wy_warps": 4}, marks=_LAUNCH_ONLY),
    {"wy_reload": True}, pytest.param({"wy_reload": True, "wy_warps": 4}, marks=_LAUNCH_ONLY),
    pytest.param({"out_warps": 4}, marks=_LAUNCH_ONLY), {"variant": "fused"},
    {"variant": "wy64"}, pytest.param({"variant": "wy64", "wy_warps": 4}, marks=_LAUNCH_ONLY),
    {"variant": "wy64", "wy_reload": False}, {"variant": "wy64", "wy_diag_x4": False},
    {"variant": "wy64", "wy_cols": 16},
    pytest.param({"variant": "wy64", "state_stages": 2}, marks=_LAUNCH_ONLY),
    {"wy_solve": "subst"}, {"wy_solve": "pow"}, {"wy_solve": "subst", "out_bv": 64},
    {"variant": "split"}, {"variant": "split", "wy_solve": "subst"},
    pytest.param({"variant": "split", "wy_apply_warps": 8}, marks=_LAUNCH_ONLY),
    {"variant": "split", "wy_bk": 16}, {"variant": "split", "wy_tf32": True, "wy_warps": 2},
    {"variant": "split", "wy_tf32": True}, {"variant": "split", "wy_tf32": False},
    pytest.param({"variant": "split", "wy_warps": 2}, marks=_LAUNCH_ONLY),
    {"variant": "split", "wy_bk": 64, "wy_warps": 2, "wy_tf32": True},
    {"variant": "split", "norm": "fused"}, {"variant": "split", "norm": "fused", "wy_bk": 16,
                                            "wy_tf32": False, "out_bv": 32, "state_bv": 16},
    {"variant": "fused", "norm": "fused"},
    {"overlap": True}, {"overlap": True, "norm": "fused", "out_bv": 32, "state_bv": 16},
    {"overlap": True, "variant": "fused", "out_bv": 64}, {"overlap": "all"},
    {"overlap": "all", "overlap_seg": 1, "norm": "fused", "apply_per_sm": 1},
    {"overlap": "all", "overlap_seg": 3, "state_bv": 16, "out_bv": 32},
    pytest.param({"overlap": "all", "apply_maxnreg": 128, "apply_per_sm": 3}, marks=_LAUNCH_ONLY),
    {"variant": "split", "wy_solve": "subst", "wy_tf32": True, "wy_warps": 1},
    {"norm_rows": 16}, {"norm_rows": 1}, {"out_bv": 16}, {"out_bv": 32, "wy_solve": "pow"},
    {"out_bv": 64}, pytest.param({"out_warps": 8, "out_bv": 64}, marks=_LAUNCH_ONLY)])
def test_prefill_launch_variants(kernel_device, tuning):
    """The launch overrides the H200 sweep timed compute the same values."""
    x = problem([70, 0, 1, 66], 2, 2, *VARIANT_DIMS, DTYPES[-1], kernel_device, 3)
    o, final = _triton("chunk_prefill").fn(*(x[a] for a in ("q", "k", "v", "g", "beta")),
                                           cu_seqlens=x["cu_seqlens"], use_qk_l2norm=True,
                                           tuning=tuning)
    check_prefill(x, o, final, None, VARIANT_DIMS[0] ** -0.5, True)


@pytest.mark.parametrize("overlap", [{"overlap": "output"}, {"overlap": "all"},
                                     {"overlap": "all", "overlap_seg": 1, "apply_per_sm": 1}])
def test_prefill_overlap_equals_sequential(kernel_device, overlap):
    """The overlapped launches (per-chunk flags; on sm_90+ programmatic dependent launches, so
    the grids really run together) compute bit for bit what the same kernels compute launched
    one after the other (overlap_pdl False), and the recurrence's values: on a GPU 8 sequences
    of up to 2k tokens, several launches, to catch a chunk read before its flag."""
    lens = [2048, 1, 1500, 0, 777, 2048, 64, 1999] if HAS_CUDA else [130, 0, 1, 64]
    hk, group = (4, 2) if HAS_CUDA else (1, 2)
    x = problem(lens, hk, group, *VARIANT_DIMS, DTYPES[-1], kernel_device, 5)
    h0 = torch.randn(len(lens), hk * group, *VARIANT_DIMS, generator=torch.Generator()
                     .manual_seed(6)).to(kernel_device)
    args = [x[a] for a in ("q", "k", "v", "g", "beta")]
    fn = _triton("chunk_prefill").fn
    want_o, want_s = fn(*args, cu_seqlens=x["cu_seqlens"], initial_state=h0, use_qk_l2norm=True,
                        tuning={**overlap, "overlap_pdl": False})
    for _ in range(5 if HAS_CUDA else 1):
        o, final = fn(*args, cu_seqlens=x["cu_seqlens"], initial_state=h0, use_qk_l2norm=True,
                      tuning=overlap)
        assert torch.equal(o, want_o) and torch.equal(final, want_s)
    check_prefill(x, o, final, h0.cpu(), VARIANT_DIMS[0] ** -0.5, True)


@pytest.mark.skipif(HAS_CUDA, reason="the counters' end values are read on the CPU tier; the "
                                     "GPU tier runs the overlap for real (test above)")
@pytest.mark.parametrize("seg, state_bv", [(3, 16), (8, 64), (1, 32)])
def test_prefill_overlap_counters_end_exact(monkeypatch, seg, state_bv):
    """The overlap's counters end at exactly the counts the waits ask for: per (chunk, value
    head) the state programs of that head (one add each), per (segment start, head) the
    segment's chunks; zero elsewhere. One add too many would let a GPU wait pass before the
    data is stored, which the interpreter's in-order programs cannot show; one too few would
    hang there."""
    from tskernels.ops.gdn import triton_chunk as tc

    made, real = [], torch.zeros

    def zeros(*shape, **kw):  # the call's counters: its [2, chunks x heads] int32 zeros
        t = real(*shape, **kw)
        if kw.get("dtype") is torch.int32 and t.dim() == 2 and t.shape[0] == 2:
            made.append(t)
        return t

    monkeypatch.setattr(torch, "zeros", zeros)
    lens, hk, group = [130, 0, 1, 64, 200], 1, 2
    x = problem(lens, hk, group, *VARIANT_DIMS, DTYPES[-1], "cpu", 7)
    tc.chunk_prefill(*(x[a] for a in ("q", "k", "v", "g", "beta")), cu_seqlens=x["cu_seqlens"],
                     use_qk_l2norm=True, tuning={"overlap": "all", "overlap_seg": seg,
                                                 "state_bv": state_bv})
    monkeypatch.undo()
    (flags,) = made
    hv, dv = hk * group, VARIANT_DIMS[1]
    want = torch.zeros_like(flags)
    c0 = 0
    for n in lens:
        nc = -(-n // 64)
        for i in range(nc):
            want[0, (c0 + i) * hv:(c0 + i + 1) * hv] = dv // min(dv, state_bv)
            if i % seg == 0:
                want[1, (c0 + i) * hv:(c0 + i + 1) * hv] = min(seg, nc - i)
        c0 += nc
    assert torch.equal(flags, want)


@pytest.mark.skipif(HAS_CUDA, reason="the AMD launch options are not CUDA's: the CPU tier runs "
                                     "the CDNA branch under the interpreter")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_prefill_cdna_launch(arch, monkeypatch):
    """The CDNA launches (16-column state blocks, the arch's stages, the MFMA option) give the
    recurrence's values (the interpreter runs the launch as a gfx942 / gfx950 device gets it)."""
    from tskernels.ops.gdn import triton_chunk as tc

    monkeypatch.setattr(tc, "cdna_arch", lambda device: arch)
    x = problem([70, 0, 1, 66], 2, 2, *VARIANT_DIMS, DTYPES[-1], "cpu", 4)
    o, final = tc.chunk_prefill(*(x[a] for a in ("q", "k", "v", "g", "beta")),
                                cu_seqlens=x["cu_seqlens"], use_qk_l2norm=True)
    check_prefill(x, o, final, None, VARIANT_DIMS[0] ** -0.5, True)


WY64 = {"variant": "wy64"}


def _prefill_fn(x, tuning, **kw):
    return _triton("chunk_prefill").fn(*(x[a] for a in ("q", "k", "v", "g", "beta")),
                                       cu_seqlens=x["cu_seqlens"], tuning=tuning, **kw)


# (few examples: each (dims, dtype, initial state, batch size) compiles its own kernels)
@settings(max_examples=max(EXAMPLES // 4, 5))
@given(lens=st.lists(st.one_of(st.sampled_from([0, 1, 64, 65]), st.integers(0, MAX_LEN)),
                     min_size=1, max_size=4),
       group=st.sampled_from([1, 2]), dims=st.sampled_from(DIMS), dtype=st.sampled_from(DTYPES),
       with_state=st.booleans(), l2=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_wy64_prefill_matches_recurrence(kernel_device, lens, group, dims, dtype, with_state,
                                         l2, seed):
    """The "wy64" WY kernel (64-row K K^T / W / U products, T through an fp32 scratch tile):
    ragged batches with empty and one-token sequences, initial states, grouped heads."""
    x = problem(lens, KEY_HEADS[-1], group, *dims, dtype, kernel_device, seed, l2)
    hv = KEY_HEADS[-1] * group
    init = (torch.randn(len(lens), hv, *dims, generator=torch.Generator().manual_seed(seed)) * 0.5
            if with_state else None)
    o, final = _prefill_fn(x, WY64, initial_state=None if init is None else
                           init.to(kernel_device), scale=0.3, use_qk_l2norm=l2)
    assert o.dtype == dtype and final.dtype == torch.float32
    check_prefill(x, o, final, init, 0.3, l2, name="wy64 ")


@pytest.mark.parametrize("dtype", DTYPES)
def test_wy64_pieces_equal_one_prefill_and_fused(kernel_device, dtype):
    """wy64: a prefill split inside and on chunk boundaries carries its state (= one long
    prefill), and equals the fused variant within the dtype's tolerance."""
    lens, first = [150, 0, 1, 70], [69, 0, 1, 64]
    x = problem(lens, 2, 2, *VARIANT_DIMS, dtype, kernel_device, 11)
    one_o, one_s = _prefill_fn(x, WY64, use_qk_l2norm=True)
    fused_o, fused_s = _prefill_fn(x, {"variant": "fused"}, use_qk_l2norm=True)
    assert_close(one_o, fused_o.double(), dtype, name="wy64 vs fused o")
    assert_close(one_s, fused_s.double(), dtype, name="wy64 vs fused state")
    bounds = x["cu_seqlens"].tolist()
    got, state = torch.empty_like(one_o), None
    for piece in (0, 1):
        spans = [(s, s + f) if piece == 0 else (s + f, e)
                 for s, e, f in zip(bounds, bounds[1:], first)]
        idx = torch.cat([torch.arange(s, e) for s, e in spans]).to(kernel_device)
        cu = torch.tensor([0, *torch.tensor([e - s for s, e in spans]).cumsum(0).tolist()],
                          dtype=torch.int32, device=kernel_device)
        sub = {a: x[a][idx] for a in ("q", "k", "v", "g", "beta")}
        o, state = _prefill_fn({**sub, "cu_seqlens": cu}, WY64, initial_state=state,
                               use_qk_l2norm=True)
        got[idx] = o
    assert_close(got, one_o.double(), dtype, name="wy64 pieces o")
    assert_close(state, one_s.double(), dtype, name="wy64 pieces state")


@pytest.mark.parametrize("pdl_ok, target, want", [(True, "sm_90", "output"),
                                                   (True, "sm_100", False),
                                                   (True, "sm_120", False),
                                                   (False, "sm_90", False),
                                                   (False, "gfx942", False)])
def test_prefill_default_overlap_rule(monkeypatch, pdl_ok, target, want):
    """A plain call overlaps the output kernel only where that was timed (sm_90, PDL present);
    compile-verified targets, ROCm and the interpreter keep the plain launch order."""
    from types import SimpleNamespace

    from tskernels.ops.gdn import triton_chunk as tc
    monkeypatch.setattr(tc.pdl, "supported", lambda device: pdl_ok)
    monkeypatch.setattr(tc, "platform_of", lambda device: SimpleNamespace(target=target))
    assert tc._default_overlap(torch.device("cpu")) == want
    assert tc.DEFAULT_OVERLAP in tc.OVERLAPS and tc.DEFAULT_OVERLAP != "all"


@pytest.mark.parametrize("pdl_ok, target, seqs, hv, dv, want", [
    (True, "sm_90", 1, 32, 128, {"state_bv": 32, "norm": "fused"}),     # 128 programs
    (True, "sm_90", 2, 32, 128, {"state_bv": 64, "norm": "fused"}),     # 256 -> 128
    (True, "sm_90", 8, 32, 128, {"state_bv": 64, "norm": "launch"}),    # 512 at 64
    (True, "sm_90", 8, 4, 32, {"state_bv": 32, "norm": "fused"}),       # dv < 64: no wide
    (True, "sm_90", 64, 4, 32, {"state_bv": 32, "norm": "launch"}),
    (True, "sm_100", 1, 32, 128, {}), (False, "sm_90", 1, 32, 128, {})])
def test_prefill_launch_rule(monkeypatch, pdl_ok, target, seqs, hv, dv, want):
    """sm_90's plain call picks state columns and the q / k norm from the state grid against
    the SM count (132 here); elsewhere the kernels' own defaults stay."""
    from types import SimpleNamespace

    from tskernels.ops.gdn import triton_chunk as tc
    monkeypatch.setattr(tc.pdl, "supported", lambda device: pdl_ok)
    monkeypatch.setattr(tc, "platform_of",
                        lambda device: SimpleNamespace(target=target, num_sms=132))
    assert tc._launch_rule(torch.device("cpu"), seqs, hv, dv) == want


@pytest.mark.parametrize("tuning, match", [({"variant": "wgmma"}, "variant"),
                                           ({"wy_solve": "lu"}, "wy_solve"),
                                           ({"norm": "inline"}, "norm"),
                                           ({"overlap": "wy"}, "overlap"),
                                           ({"overlap": "all", "variant": "fused"}, "split"),
                                           ({"overlap": "all", "overlap_seg": 0}, "overlap_seg")])
def test_prefill_rejects_unknown_variant(tuning, match):
    x = problem([3], 1, 1, 16, 16, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match=match):
        _prefill_fn(x, tuning)
