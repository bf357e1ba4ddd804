"""CUDA paged prefill (attention.extend.cuda_paged: tskernels/ops/attention/cuda/prefill_wgmma.cu
built with -DPAGED, every key read from the paged cache by TMA) vs the references on the GPU:
new tokens over cached prefixes (none, one token, ending on / off page and tile boundaries),
pages of 8-256 slots, permuted page tables with NaN in every unused slot, GQA, bf16 / fp16,
strided q, NaN-poisoned outputs, each tile config; named through the op; clear errors. The
split-KV launch (splits > 1) the same way, plus NaN in the workspace rows it must write, split
counts past a block's tiles, one-tile splits up to the diagonal, graph replay. GPU only
(pytest -m gpu), apart from the contiguous-K/V kernel's tests (test_attention_cuda_extend.py) so
that the GPU tier records each backend on its own."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.attention as attn
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import poisoned_like

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import capture_graph, make_paged, ref_extend
    from .test_attention_cuda_extend import _check, needs_hopper
except ImportError:
    from test_attention_common import capture_graph, make_paged, ref_extend
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


# --- split-KV (-DPAGED -DSPLIT: key splits merged by ops/shared/split_kv.py) ---------------

def _split_case(lens, new, page_size=16, hq=8, hkv=2, dtype=torch.bfloat16, seed=21):
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged(lens, page_size, hkv, 128, dtype, None, "cuda", gen)
    indptr = torch.tensor([0, *torch.tensor(new, dtype=torch.long).cumsum(0).tolist()],
                          dtype=torch.int32, device="cuda")
    q = torch.randn(int(indptr[-1]), hq + 3, 128, generator=gen).to("cuda", dtype)[:, :hq]
    return kv, indptr, q


def _split_plan(kv, indptr, q, splits, tile=(128, 3), gqa_pack=False):
    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    return CudaExtendPlan(indptr, kv.page_table, kv.seq_lens, num_q_heads=q.shape[1],
                          num_kv_heads=kv.k_cache.shape[2], head_dim=128,
                          page_size=kv.k_cache.shape[1], q_dtype=q.dtype, kv_dtype=q.dtype,
                          scale=128 ** -0.5, block_n=tile[0], stages=tile[1], paged=True,
                          splits=splits, gqa_pack=gqa_pack)


def _poison_used_partials(plan) -> int:
    """NaN into every workspace row the kernel must write (so a row it skips shows); returns
    the largest split count a block got. A block's rows are tokens x all heads, or with GQA
    packing (token, head-in-group) pairs r -> (r // group, kv * group + r % group)."""
    work = plan.work.view(-1, 5).tolist()
    ptr = plan.qo_indptr.tolist()
    g = plan.group if plan.gqa_pack else 1
    most = 0
    for b, i, _, _, k in work:
        most = max(most, k + 1)
        r = torch.arange(128 * i, min(128 * (i + 1), (ptr[b + 1] - ptr[b]) * g))
        heads = (torch.arange(plan.hkv)[None, :] * g + r[:, None] % g) if g > 1 else \
            torch.arange(plan.hq)[None, :].expand(len(r), -1)
        tok = ptr[b] + r // g
        rows = ((tok[:, None] * plan.hq + heads) * plan.splits + k).flatten()
        rows = rows.to(plan.partial_o.device)
        plan.partial_o[rows] = float("nan")
        plan.partial_lse[rows] = float("nan")
    return most


def _most_splits(pre: int, n: int, splits: int, block_n: int, group: int = 1) -> int:
    """The split count of a request's last query block (the one whose first row sits
    furthest in: its splits are capped by the tiles up to that row's position), for n new
    tokens over pre cached ones, rows packed by `group`."""
    first_row = (n * group - 1) // 128 * 128
    return min(splits, (pre + first_row // group) // block_n + 1)


def _check_split(lens, new, splits, tile=(128, 3), gqa_pack=False, **kw):
    kv, indptr, q = _split_case(lens, new, **kw)
    plan = _split_plan(kv, indptr, q, splits, tile, gqa_pack)
    assert plan.splits == splits and plan.gqa_pack == gqa_pack
    most = _poison_used_partials(plan) if splits > 1 else 1
    out = poisoned_like(q)
    assert plan.run(q, kv.k_cache, kv.v_cache, out=out) is out
    truth, same = ref_extend(q, kv, indptr)
    assert_close(out, truth, baseline=same,
                 name=f"cuda paged split {splits} pack {gqa_pack} {lens} {new} {tile}")
    return most


@needs_hopper
@pytest.mark.parametrize("splits", [2, 3, 7, 64])
def test_cuda_paged_split_matches_reference(splits):
    """Ragged batch over prefixes 0 / short / long (ending mid-tile), 16-slot pages (split
    boundaries inside pages at BN = 64), more splits than a short block has tiles (64)."""
    for tile in ((128, 3), (64, 4)):
        most = _check_split([300, 150, 3000, 1], [300, 20, 200, 1], splits, tile)
        assert most == _most_splits(2800, 200, splits, tile[0])  # the long request's


@needs_hopper
@pytest.mark.parametrize("page_size", [8, 256])
def test_cuda_paged_split_boundaries(page_size):
    """Splits one tile long (the last one starting at the diagonal's tile), boundaries inside
    256-slot pages, a prefix ending on a tile boundary and off it, fp16, GQA 4."""
    for lens, new in (([1280 + 64], [64]), ([1280 + 128], [128]), ([2000], [300])):
        n_first = (lens[0] - new[0]) // 128 + 1  # tiles up to the first new row's
        _check_split(lens, new, n_first, page_size=page_size, hq=8, hkv=2,
                     dtype=torch.float16)
        _check_split(lens, new, n_first + 5, page_size=page_size)  # capped at n_first


@needs_hopper
def test_cuda_paged_split_auto_and_graph_replay():
    """splits=None picks a split for a short extend over a long prefix (32 heads, GQA 4) and
    stays 1 for a plain prefill; the split launch (kernel + merge) replays in a CUDA graph."""
    kv, indptr, q = _split_case([6000 + 16], [16], hq=32, hkv=8)
    plan = _split_plan(kv, indptr, q, None)
    assert plan.splits > 1
    out = torch.empty_like(q)
    graph = capture_graph(lambda: plan.run(q, kv.k_cache, kv.v_cache, out=out))
    gen = torch.Generator().manual_seed(3)
    for step in range(2):
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", q.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        truth, same = ref_extend(q, kv, indptr)
        assert_close(out, truth, baseline=same, name=f"cuda paged split replay {step}")
    kv, indptr, q = _split_case([4096], [4096], hq=32, hkv=8)
    assert _split_plan(kv, indptr, q, None).splits == 1


@needs_hopper
def test_cuda_paged_split_rejections():
    kv, indptr, q = _split_case([40, 70], [8, 70])
    for bad in (0, 65, 2.0, True, "4"):
        with pytest.raises(ValueError, match="splits must be"):
            _split_plan(kv, indptr, q, bad)
    from tskernels.ops.attention.cuda_extend import CudaExtendPlan
    kv2, indptr2, _ = _split_case([40, 70], [40, 70])
    with pytest.raises(ValueError, match="need the paged plan"):
        CudaExtendPlan(indptr2, kv2.page_table, kv2.seq_lens, num_q_heads=8, num_kv_heads=2,
                       head_dim=128, page_size=16, q_dtype=torch.bfloat16,
                       kv_dtype=torch.bfloat16, scale=0.1, splits=2)


@needs_hopper
@pytest.mark.parametrize("splits", [1, 3, 64])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 2), (4, 4), (16, 1)])
def test_cuda_paged_gqa_pack_matches_reference(splits, hq, hkv):
    """GQA packing (-DPACK, rows = (token, head-in-group) pairs), unsplit and split: groups of
    4, 3 (a token's heads straddle two blocks), 1 and 16, a ragged batch over prefixes 0 /
    short / long, single tokens; the 64-key tile too for groups of 4."""
    for tile in ((128, 3), (64, 4)) if hq == 4 * hkv else ((128, 3),):
        most = _check_split([300, 150, 3000, 1, 40], [300, 20, 200, 1, 33], splits, tile,
                            gqa_pack=True, hq=hq, hkv=hkv)
        assert most == _most_splits(2800, 200, splits, tile[0], hq // hkv)


@needs_hopper
def test_cuda_paged_gqa_pack_boundaries_fp16():
    """Packed one-tile splits up to the diagonal, 256-slot pages, fp16."""
    for lens, new in (([1280 + 64], [64]), ([2000], [300]), ([700], [16])):
        n_first = (lens[0] - new[0]) // 128 + 1
        _check_split(lens, new, n_first, page_size=256, hq=8, hkv=2, dtype=torch.float16,
                     gqa_pack=True)


@st.composite
def split_problem(draw):
    hkv = draw(st.integers(1, 3))
    lens = draw(tst.seq_lens(max_batch=4, max_len=1500))
    return dict(lens=lens, new=[draw(st.integers(0, n)) for n in lens],
                page_size=draw(st.sampled_from([8, 16, 64, 256])), hkv=hkv,
                hq=hkv * draw(st.sampled_from([1, 3, 4, 8])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                tile=draw(st.sampled_from([(128, 3), (64, 4), (128, 2)])),
                splits=draw(st.sampled_from([1, 2, 3, 5, 16, 64])),
                gqa_pack=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


@needs_hopper
@pytest.mark.parametrize("shard", tst.shards())
def test_cuda_paged_split_pack_property(shard):
    """Drawn ragged batches (empty requests, prefixes 0 .. all but one token) through every
    split count / packing / tile / page size combination (the GPU tier's full run; the lab
    script runs the deterministic tests above)."""
    def check(data):
        c = data.draw(split_problem())
        if sum(c["new"]) == 0:
            return
        _check_split(c["lens"], c["new"], c["splits"], c["tile"], c["gqa_pack"],
                     page_size=c["page_size"], hq=c["hq"], hkv=c["hkv"], dtype=c["dtype"],
                     seed=c["seed"])
    tst.run_sharded(check, shard, data=st.data())
