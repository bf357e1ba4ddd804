"""The MLA extend plan's host side: `mla.extend_plan` given the caller's host copies of
qo_indptr / seq_lens gives the same plan and the same output as without them (and as the one-shot
`mla.extend`), reads nothing of the index tensors to the host (plan and run), and refuses copies
of the wrong length by name. Triton under the interpreter on the CPU tier."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tskernels.ops.mla as mla
from tskernels.testing.problems import paged_kv

from .test_attention_extend_plan_host import bad_host_copies

RANK, ROPE = 64, 16


class NoHostRead(torch.Tensor):
    """An index tensor (and every tensor computed from it) that fails the test when its values
    are read to the host."""

    def _boom(self, *a, **k):
        raise AssertionError("read an index tensor's values to the host")

    tolist = item = cpu = numpy = __array__ = _boom
    __int__ = __index__ = __bool__ = __float__ = _boom


def _batch(dtype, lens=(70, 41, 9, 0), new=(33, 41, 0, 0), page=16, heads=3):
    gen = torch.Generator().manual_seed(7)
    kv = paged_kv(list(lens), page, 1, RANK + ROPE, dtype=dtype, gen=gen)
    ptr = [0, *np.cumsum(new).tolist()]
    qo = torch.tensor(ptr, dtype=torch.int32)
    q = torch.randn(ptr[-1], heads, RANK + ROPE, generator=gen).to(dtype)
    return kv, kv.k_cache[:, :, 0], qo, q, ptr, list(lens)


def _plan(kv, cache, qo, heads, backend, seq_lens=None, **host):
    return mla.extend_plan(qo, kv.page_table, kv.seq_lens if seq_lens is None else seq_lens,
                           num_heads=heads, kv_cache=cache, scale=0.07, q_dtype=cache.dtype,
                           kv_lora_rank=RANK, backend=backend, **host)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
@pytest.mark.parametrize("shape", ["ragged", "split"])
def test_host_copies_give_the_same_output(backend, dtype, kind, shape):
    batch = dict(lens=(300, 40), new=(5, 2), heads=3) if shape == "split" else {}
    kv, cache, qo, q, ptr, lens = _batch(dtype, **batch)
    heads = q.shape[1]
    wrap = {"list": list, "numpy": np.array,
            "tensor": lambda x: torch.tensor(x, dtype=torch.int32)}[kind]
    base = _plan(kv, cache, qo, heads, backend)
    got = _plan(kv, cache, qo, heads, backend, host_qo_indptr=wrap(ptr), host_seq_lens=wrap(lens))
    assert repr(got) == repr(base)
    if backend == "triton" and shape == "split":  # T (the split workspace) from the copies
        assert got.num_splits > 1 and got.num_tokens == base.num_tokens == ptr[-1]
    o = got.run(q, cache)
    torch.testing.assert_close(o, base.run(q, cache), rtol=0, atol=0)
    one_shot = mla.extend(q, cache, qo, kv.page_table, kv.seq_lens, scale=0.07,
                          kv_lora_rank=RANK, backend=backend)
    torch.testing.assert_close(o, one_shot, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_no_host_read_with_host_copies(backend):
    """Plan and run with host copies read nothing of qo_indptr / seq_lens (nor of anything
    computed from them); without the copies the plan reads them (the check catches it)."""
    kv, cache, qo, q, ptr, lens = _batch(torch.float32)
    guarded = dict(qo=qo.as_subclass(NoHostRead), seq_lens=kv.seq_lens.as_subclass(NoHostRead))
    plan = _plan(kv, cache, guarded["qo"], q.shape[1], backend, seq_lens=guarded["seq_lens"],
                 host_qo_indptr=np.array(ptr), host_seq_lens=lens)
    o = plan.run(q, cache)
    want = _plan(kv, cache, qo, q.shape[1], backend).run(q, cache)
    torch.testing.assert_close(torch.Tensor(o), want, rtol=0, atol=0)
    with pytest.raises(AssertionError, match="read an index tensor"):
        _plan(kv, cache, guarded["qo"], q.shape[1], backend, seq_lens=guarded["seq_lens"])


def test_bad_host_copies():
    kv, cache, qo, q, ptr, lens = _batch(torch.float32)
    for host, err, match in bad_host_copies(ptr, lens):
        for backend in ("triton", "reference"):
            with pytest.raises(err, match=match):
                _plan(kv, cache, qo, q.shape[1], backend, **host)


def test_plan_shared_by_layers_with_out():
    """One plan per step, `run` per layer into the caller's buffer."""
    kv, cache, qo, q, ptr, lens = _batch(torch.float16)
    plan = _plan(kv, cache, qo, q.shape[1], "triton", host_qo_indptr=ptr, host_seq_lens=lens)
    out = torch.full((q.shape[0], q.shape[1], RANK), float("nan"), dtype=q.dtype)
    for layer_cache in (cache, cache * 0.5):   # two layers' caches
        got = plan.run(q, layer_cache, out=out)
        assert got is out
        want = mla.extend(q, layer_cache, qo, kv.page_table, kv.seq_lens, scale=0.07,
                          kv_lora_rank=RANK, backend="reference")
        torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)
