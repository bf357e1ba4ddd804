"""Triton absorbed-MLA decode / extend vs tskernels_ref.mla: ragged lengths, permuted
NaN-poisoned pages, 1-128 heads, fp8 latent, split-KV."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import tskernels.ops.mla as mla
import tskernels_ref.mla as ref
from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst
from tskernels.testing.problems import paged_kv

FP8 = torch.float8_e4m3fn


@st.composite
def mla_problem(draw, device):
    small = device == "cpu"
    lens = draw(tst.seq_lens(max_batch=3 if small else 8, max_len=48 if small else 300))
    return dict(lens=lens, new=[draw(st.integers(0, min(n, 4 if small else 12))) for n in lens],
                heads=draw(st.sampled_from([1, 3, 16] if small else [1, 16, 22, 64, 128])),
                page_size=draw(st.sampled_from([1, 16, 64])),
                dtype=draw(st.sampled_from([torch.float16, torch.float32] if small
                                           else [torch.bfloat16, torch.float16])),
                fp8=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


def _latent(c, device, gen):
    kv = paged_kv(c["lens"], c["page_size"], 1, 576, dtype=c["dtype"], device=device, gen=gen)
    cache, scale = kv.k_cache[:, :, 0], None
    if c["fp8"]:
        scale = (cache.float().nan_to_num(0).abs().amax() / 448.0).reshape(1)
        cache = (cache.float() / scale).to(FP8)
    return kv, cache, scale


def _check(o, fn, q, cache, *args, **kw):
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    c64 = cache.cpu() if cache.dtype == FP8 else cache.cpu().double()
    truth = fn(q.cpu().double(), c64, *cpu, **kw)
    same = fn(q.cpu(), cache.cpu(), *cpu, **kw)
    assert_close(o, truth, baseline=same)


@pytest.mark.parametrize("shard", tst.shards())
def test_mla_decode_matches_reference(kernel_device, shard):
    tst.run_sharded(lambda data: _mla_decode_case(data.draw(mla_problem(kernel_device)),
                                                 kernel_device), shard, data=st.data())


def _mla_decode_case(c, kernel_device):
    gen = torch.Generator().manual_seed(c["seed"])
    kv, cache, scale = _latent(c, kernel_device, gen)
    q = torch.randn(len(c["lens"]), c["heads"], 576, generator=gen).to(kernel_device, c["dtype"])
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=c["heads"], kv_cache=cache,
                           scale=0.07, q_dtype=c["dtype"], backend="triton")
    o = plan.run(q, cache, kv_scale=scale, out=torch.full((*q.shape[:2], 512), float("nan"),
                                                          dtype=q.dtype, device=q.device))
    _check(o, ref.decode, q, cache, kv.page_table, kv.seq_lens, scale=0.07, kv_scale=scale)


@pytest.mark.parametrize("shard", tst.shards())
def test_mla_extend_matches_reference(kernel_device, shard):
    tst.run_sharded(lambda data: _mla_extend_case(data.draw(mla_problem(kernel_device)),
                                                 kernel_device), shard, data=st.data())


def _mla_extend_case(c, kernel_device):
    gen = torch.Generator().manual_seed(c["seed"])
    kv, cache, scale = _latent(c, kernel_device, gen)
    indptr = torch.tensor([0, *torch.tensor(c["new"]).cumsum(0).tolist()], dtype=torch.int32,
                          device=kernel_device)
    q = torch.randn(int(indptr[-1]), c["heads"], 576, generator=gen).to(kernel_device, c["dtype"])
    o = mla.extend(q, cache, indptr, kv.page_table, kv.seq_lens, scale=0.07, kv_scale=scale,
                   backend="triton")
    _check(o, ref.extend, q, cache, indptr, kv.page_table, kv.seq_lens, scale=0.07,
           kv_scale=scale)


@pytest.mark.parametrize("splits", [3, 20, 40])
def test_mla_decode_forced_splits(kernel_device, splits):
    """Forced split counts (empty splits included): the merge reads [splits x 512] partials in
    whole rows (few splits) or 256 / 128 / 64-column programs (many)."""
    c = dict(lens=[150, 1, 0, 67], page_size=16, heads=3, dtype=torch.float16, fp8=splits == 20,
             seed=splits)
    gen = torch.Generator().manual_seed(c["seed"])
    kv, cache, scale = _latent(c, kernel_device, gen)
    q = torch.randn(len(c["lens"]), 3, 576, generator=gen).to(kernel_device, c["dtype"])
    plan = mla.decode_plan(kv.page_table, kv.seq_lens, num_heads=3, kv_cache=cache, scale=0.07,
                           q_dtype=q.dtype, num_splits=splits, backend="triton")
    assert plan.num_splits == splits
    o = plan.run(q, cache, kv_scale=scale, out=torch.full((*q.shape[:2], 512), float("nan"),
                                                          dtype=q.dtype, device=q.device))
    _check(o, ref.decode, q, cache, kv.page_table, kv.seq_lens, scale=0.07, kv_scale=scale)
