"""CUDA paged prefill (attention.extend.cuda_paged: tskernels/ops/attention/cuda/prefill_wgmma.cu
built with -DPAGED, every key read from the paged cache by TMA) vs the references on the GPU:
new tokens over cached prefixes (none, one token, ending on / off page and tile boundaries),
pages of 8-256 slots, permuted page tables with NaN in every unused slot, GQA, bf16 / fp16,
strided q, NaN-poisoned outputs, each tile config; named through the op; clear errors. GPU only
(pytest -m gpu), apart from the contiguous-K/V kernel's tests (test_attention_cuda_extend.py) so
that the GPU tier records each backend on its own."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import make_paged, ref_extend
    from .test_attention_cuda_extend import _check, needs_hopper
except ImportError:
    from test_attention_common import make_paged, ref_extend
    from test_attention_cuda_extend import _check, needs_hopper

pytestmark = pytest.mark.gpu


@st.composite
def paged_problem(draw):
    hkv = draw(st.integers(1, 4))
    lens = draw(tst.seq_lens(max_batch=5, max_len=900))
    return dict(lens=lens, new=[draw(st.integers(0, n)) for n in lens],
                page_size=draw(st.sampled_from([8, 16, 32, 64, 128, 256])), hkv=hkv,
                hq=hkv * draw(st.sampled_from([1, 2, 4, 8])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                tile=draw(st.sampled_from([None, (128, 3), (64, 4), (128, 2)])),
                strided_q=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


def _run_paged(c):
    """New tokens over cached prefixes; the pool's unused slots (past every length, and the
    pages no request owns) hold NaN, page tables are permuted (make_paged)."""
    gen = torch.Generator().manual_seed(c["seed"])
    kv = make_paged(c["lens"], c["page_size"], c["hkv"], 128, c["dtype"], None, "cuda", gen)
    indptr = torch.tensor([0, *torch.tensor(c["new"], dtype=torch.long).cumsum(0).tolist()],
                          dtype=torch.int32, device="cuda")
    T = int(indptr[-1])
    q = torch.randn(T, c["hq"] + (3 if c["strided_q"] else 0), 128, generator=gen)
    _check(c, kv, indptr, q.to("cuda", c["dtype"])[:, :c["hq"]], paged=True)


@needs_hopper
@pytest.mark.parametrize("shard", tst.shards())
def test_cuda_paged_prefill_matches_reference(shard):
    tst.run_sharded(lambda data: _run_paged(data.draw(paged_problem())), shard, data=st.data())


@needs_hopper
@pytest.mark.parametrize("page_size", [8, 16, 256])
def test_cuda_paged_prefill_edges(page_size):
    """No prefix, a prefix of one token, prefixes ending on / off page and tile boundaries,
    single new tokens, a request with nothing new, a long chunk over a long prefix."""
    for lens, new in (([10, 300], [10, 300]), ([2, 129, 128], [1, 1, 1]),
                      ([page_size + 3, 4 * page_size, 700], [3, page_size, 0]),
                      ([3000, 257], [1000, 129])):
        _run_paged(dict(lens=lens, new=new, page_size=page_size, hq=8, hkv=2,
                        dtype=torch.bfloat16, tile=(128, 3), strided_q=True, seed=13))


@needs_hopper
def test_cuda_paged_prefill_named_and_rejections():
    """Named through the op (backend="cuda_paged") over a prefix; what it does not do fails
    clearly."""
    gen = torch.Generator().manual_seed(1)
    kv = make_paged([40, 70], 16, 2, 128, torch.bfloat16, None, "cuda", gen)
    indptr = torch.tensor([0, 8, 78], dtype=torch.int32, device="cuda")  # 32 + 8, 0 + 70
    q = torch.randn(78, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    o = attn.extend(q, kv.k_cache, kv.v_cache, indptr, kv.page_table, kv.seq_lens,
                    backend="cuda_paged")
    truth, same = ref_extend(q, kv, indptr)
    assert_close(o, truth, baseline=same, name="cuda paged prefill, named")
    kw = dict(num_q_heads=8, q_dtype=torch.bfloat16, backend="cuda_paged")
    kv4 = make_paged([40, 70], 4, 2, 128, torch.bfloat16, None, "cuda", gen)
    with pytest.raises(Exception, match="cannot run here|trait page_size"):
        attn.extend_plan(indptr, kv4.page_table, kv4.seq_lens, k_cache=kv4.k_cache, **kw)
    with pytest.raises(Exception, match="cannot run here|trait"):
        attn.extend_plan(indptr, kv.page_table, kv.seq_lens, k_cache=kv.k_cache,
                         softcap=3.0, **kw)
    plan = attn.extend_plan(indptr, kv.page_table, kv.seq_lens, k_cache=kv.k_cache, **kw)
    with pytest.raises(ValueError, match="k_cache must be"):
        plan.run(q, kv.k_cache[:, :8], kv.v_cache)
