"""The batched CPU attention backend ("torch_cpu") against tskernels_ref: decode and extend
through the public plan API, and store_kv, on ragged, paged, GQA problems (lengths 0 and 1,
lengths not a multiple of the page size, permuted page tables, garbage in unused slots: finite
garbage, NaN poison, and out-of-range page-table padding)."""
from __future__ import annotations

import pytest
import torch

import tskernels
import tskernels_ref.attention as ref
from hypothesis import given
from hypothesis import strategies as st

from tskernels.numerics import assert_close
from tskernels.ops.attention import torch_cpu
from tskernels.ops.attention.torch_cpu import BACKEND
from tskernels.testing import strategies as tst
from tskernels.testing.problems import paged_kv


def _problem(seed, lens, page_size, hq, hkv, d=32):
    g = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_each) + 3
    kc = torch.randn(num_pages, page_size, hkv, d, generator=g) * 3  # garbage everywhere
    vc = torch.randn(num_pages, page_size, hkv, d, generator=g)
    perm = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    width = max(pages_each + [1]) + 2
    table = torch.zeros(len(lens), width, dtype=torch.int32)  # padded with the null page 0
    for b, n in enumerate(pages_each):
        table[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    return g, kc, vc, table, torch.tensor(lens, dtype=torch.int32)


@pytest.fixture(params=["native", "torch"])
def path(request, monkeypatch):
    """fp32 problems run tskernels._cpu's kernels when built; "torch" forces the torch path."""
    if request.param == "torch":
        monkeypatch.setattr(torch_cpu, "_cpu", None)
    elif torch_cpu._cpu is None:
        pytest.skip("tskernels._cpu extension not built")
    return request.param


CASES = [(0, [7, 1, 33, 16], 4, 8, 2), (1, [0, 5, 64, 2], 16, 6, 6), (2, [100], 1, 12, 3),
         (3, [3, 0, 0, 50, 17], 8, 4, 1)]


@pytest.mark.parametrize("d", [32, 64, 128])  # 64/128: the AVX-512 kernel; 32: portable loop
@pytest.mark.parametrize("seed,lens,page_size,hq,hkv", CASES)
def test_decode_plan_matches_reference(seed, lens, page_size, hq, hkv, path, d):
    g, kc, vc, table, seq = _problem(seed, lens, page_size, hq, hkv, d)
    q = torch.randn(len(lens), hq, kc.shape[-1], generator=g)
    plan = tskernels.attention.decode_plan(table, seq, num_q_heads=hq, k_cache=kc,
                                           q_dtype=q.dtype, backend=BACKEND)
    got = plan.run(q, kc, vc)
    want = ref.decode(q, kc, vc, table, seq)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    out = torch.full_like(q, float("nan"))
    plan.run(q, kc, vc, out=out)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed,lens,page_size,hq,hkv", CASES)
def test_extend_plan_matches_reference(seed, lens, page_size, hq, hkv):
    g, kc, vc, table, seq = _problem(seed, lens, page_size, hq, hkv)
    new = [min(n, 1 + (7 * i) % 9) for i, n in enumerate(lens)]  # chunk sizes incl. 0 and n
    qo = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qo[-1]), hq, kc.shape[-1], generator=g)
    for causal in (True, False):
        plan = tskernels.attention.extend_plan(qo, table, seq, num_q_heads=hq, k_cache=kc,
                                               q_dtype=q.dtype, causal=causal, backend=BACKEND)
        want = ref.extend(q, kc, vc, qo, table, seq, causal=causal)
        torch.testing.assert_close(plan.run(q, kc, vc), want, rtol=1e-5, atol=1e-5)
        got = tskernels.attention.extend(q, kc, vc, qo, table, seq, causal=causal,
                                         backend=BACKEND)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_reference(dtype, path):
    g = torch.Generator().manual_seed(5)
    kc = torch.randn(6, 4, 2, 16, generator=g).to(dtype)
    vc = torch.randn(6, 4, 2, 16, generator=g).to(dtype)
    k = torch.randn(5, 2, 16, generator=g)
    v = torch.randn(5, 2, 16, generator=g)
    slots = torch.tensor([4, 23, -1, 9, 10], dtype=torch.int64)
    kr, vr = kc.clone(), vc.clone()
    ref.store_kv(k.to(dtype), v.to(dtype), kr, vr, slots)
    tskernels.attention.store_kv(k.to(dtype), v.to(dtype), kc, vc, slots, backend=BACKEND)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_opt_in_never_auto_selected():
    """On a CPU the reference stays the default; the batched backend runs when named."""
    traits = {"head_dim": 64, "page_size": 16, "gqa": 1, "softcap": False,
              "sliding_window": False, "sinks": False}
    prob = dict(device="cpu", formats={"q": "fp32", "kv": "fp32"}, traits=traits)
    assert tskernels.select("attention", "decode", **prob).backend == "reference"
    assert "opt-in backend" in tskernels.explain("attention", "decode", file=False, **prob)
    assert tskernels.select("attention", "decode", backend=BACKEND, **prob).backend == BACKEND
    with tskernels.use_backend({"attention": BACKEND}):
        assert tskernels.select("attention", "decode", **prob).backend == BACKEND
    with pytest.raises(tskernels.SelectionError, match="cannot run here"):
        tskernels.select("attention", "decode", backend=BACKEND, device="cpu",
                         formats={"q": "fp32", "kv": "fp32"}, traits={**traits, "sinks": True})


@given(seed=st.integers(0, 2**31 - 1), lens=tst.seq_lens(max_batch=5, max_len=70),
       page_size=tst.page_sizes(max_page=32), heads=tst.gqa_heads(max_kv_heads=3),
       d=st.sampled_from([32, 64, 128]))
def test_nan_poisoned_pages_and_garbage_padding(seed, lens, page_size, heads, d):
    """The contract's worst case: NaN in every slot no sequence owns, and page-table padding
    pointing anywhere (even past the cache)."""
    hq, hkv = heads
    gen = torch.Generator().manual_seed(seed)
    kv = paged_kv(lens, page_size, hkv, d, torch.float32, gen=gen)
    table = kv.page_table.clone()
    for b, n in enumerate(lens):
        table[b, -(-n // page_size):] = 10_000 + b  # out-of-range garbage past the row's pages
    q = torch.randn(len(lens), hq, d, generator=gen)
    want = ref.decode(q.double(), kv.k_cache.double(), kv.v_cache.double(), kv.page_table,
                      kv.seq_lens)
    native = torch_cpu._cpu
    for lib in {native, None}:  # the native kernel (when built) and the torch path
        torch_cpu._cpu = lib
        try:
            got = tskernels.attention.decode(q, kv.k_cache, kv.v_cache, table, kv.seq_lens,
                                             backend=BACKEND)
        finally:
            torch_cpu._cpu = native
        assert_close(got, want, baseline=ref.decode(q, kv.k_cache, kv.v_cache, kv.page_table,
                                                    kv.seq_lens), name=f"decode ({lib})")
    new = [min(n, 3) for n in lens]
    qo = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    qe = torch.randn(int(qo[-1]), hq, d, generator=gen)
    got = tskernels.attention.extend(qe, kv.k_cache, kv.v_cache, qo, table, kv.seq_lens,
                                     backend=BACKEND)
    want = ref.extend(qe.double(), kv.k_cache.double(), kv.v_cache.double(), qo, kv.page_table,
                      kv.seq_lens)
    assert_close(got, want, baseline=ref.extend(qe, kv.k_cache, kv.v_cache, qo, kv.page_table,
                                                kv.seq_lens))


def test_native_decode_and_store_reject_bad_pages_and_slots(path):
    g, kc, vc, table, seq = _problem(9, [5, 9], 4, 4, 2)
    q = torch.randn(2, 4, kc.shape[-1], generator=g)
    bad = table.clone()
    bad[1, 0] = kc.shape[0] + 7  # an owned page past the cache
    with pytest.raises((ValueError, IndexError), match="page|index"):
        tskernels.attention.decode(q, kc, vc, bad, seq, backend=BACKEND)
    k = torch.randn(2, 2, kc.shape[-1])
    slots = torch.tensor([3, kc.shape[0] * kc.shape[1]], dtype=torch.int64)
    with pytest.raises((ValueError, IndexError), match="slot|index|out of"):
        tskernels.attention.store_kv(k, k, kc, vc, slots, backend=BACKEND)


@pytest.mark.skipif(torch_cpu._cpu is None, reason="tskernels._cpu extension not built")
@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2), (128, 4, 4), (64, 16, 1)])
def test_native_decode_vector_and_portable_paths_agree_with_reference(d, hq, hkv):
    """The AVX-512 kernel (group <= 8, d 64/128), its portable fallback (vector=False, also
    what group > 8 and other head dims use) against the float64 reference."""
    g, kc, vc, table, seq = _problem(11, [0, 1, 37, 100], 16, hq, hkv, d)
    q = torch.randn(4, hq, d, generator=g)
    want = ref.decode(q.double(), kc.double(), vc.double(), table, seq)
    for vector in (True, False):
        o = torch.full_like(q, float("nan"))
        torch_cpu._cpu.decode_attn_f32(
            q.data_ptr(), q.stride(0), q.stride(1), kc.data_ptr(), vc.data_ptr(), kc.shape[0],
            16, hkv, d, table.data_ptr(), table.stride(0), table.shape[1], seq.data_ptr(), 4, hq,
            d ** -0.5, o.data_ptr(), o.stride(0), o.stride(1), vector=vector)
        assert_close(o, want, baseline=ref.decode(q, kc, vc, table, seq), name=f"vector={vector}")


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d,hq,hkv", [(64, 9, 3), (128, 4, 4), (32, 6, 2), (64, 16, 1)])
def test_decode_bf16_cache_matches_reference(d, hq, hkv, q_dtype, path):
    """bf16 caches (the engine's bf16 pool): widened as read, fp32 math, o rounded once."""
    g, kc, vc, table, seq = _problem(13, [0, 1, 37, 100, 16], 16, hq, hkv, d)
    kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(5, hq, d, generator=g).to(q_dtype)
    plan = tskernels.attention.decode_plan(table, seq, num_q_heads=hq, k_cache=kc,
                                           q_dtype=q.dtype, backend=BACKEND)
    out = torch.full_like(q, float("nan"))
    got = plan.run(q, kc, vc, out=out)
    assert got is out
    want = ref.decode(q.double(), kc.double(), vc.double(), table, seq)
    assert_close(got, want, baseline=ref.decode(q, kc, vc, table, seq))
    if path == "native":
        for vector in (True, False):
            o = torch.full((5, hq, d), float("nan"))
            qf = q.float()
            torch_cpu._cpu.decode_attn_f32(
                qf.data_ptr(), qf.stride(0), qf.stride(1), kc.data_ptr(), vc.data_ptr(),
                kc.shape[0], 16, hkv, d, table.data_ptr(), table.stride(0), table.shape[1],
                seq.data_ptr(), 5, hq, d ** -0.5, o.data_ptr(), o.stride(0), o.stride(1),
                vector=vector, bf16_cache=True)
            assert_close(o, ref.decode(qf.double(), kc.double(), vc.double(), table, seq),
                         name=f"bf16 cache, vector={vector}")
