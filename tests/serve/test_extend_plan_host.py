"""The serving runner hands the extend plan its host copies of qo_indptr / seq_lens (issue 20:
the plan then reads nothing back from the device), equal to what it uploaded, for a prefill, a
later turn over a cached prefix, and a chunked prefill next to running decodes (the extend rows
after the decode rows)."""
from __future__ import annotations

import numpy as np

import tskernels
from serve.engine import Engine, SamplingParams

KW = dict(device="cpu", dtype="float32", max_num_seqs=4, max_model_len=512, num_kv_pages=256,
          page_size=8, chunked_prefill_size=64)


def _spy_and_run(monkeypatch, family, model: str, seed: int, first_len: int, later_len: int,
                 decode_tokens: int) -> list:
    """Serve a prefill, a later turn over its cached prefix and a chunked prefill next to a
    running decode; every `family.extend_plan` call as (qo_indptr, seq_lens, host copies)."""
    calls = []
    real = family.extend_plan

    def spy(qo_indptr, page_table, seq_lens, **kw):
        calls.append((qo_indptr.tolist(), seq_lens.tolist(), kw.get("host_qo_indptr"),
                      kw.get("host_seq_lens")))
        return real(qo_indptr, page_table, seq_lens, **kw)

    monkeypatch.setattr(family, "extend_plan", spy)
    eng = Engine(model, **KW)
    rng = np.random.default_rng(seed)
    first = rng.integers(10, 200, first_len).tolist()
    eng.generate([first], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    eng.add_request("a", rng.integers(10, 200, 20).tolist(),
                    SamplingParams(max_tokens=decode_tokens, temperature=0.0, ignore_eos=True))
    eng.step()
    eng.add_request("b", first + rng.integers(10, 200, later_len).tolist(),   # cached prefix
                    SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert len(calls) >= 4
    for ptr, lens, host_ptr, host_lens in calls:
        assert host_ptr is not None and host_lens is not None
        assert list(host_ptr) == ptr and list(host_lens) == lens
    assert any(p[0] == 0 and len(p) > 1 and lens[0] > p[1] for p, lens, *_ in calls)
    return calls


def test_extend_plans_get_the_uploaded_lengths_on_the_host(monkeypatch):
    _spy_and_run(monkeypatch, tskernels.attention, "dummy:tiny-llama", 0, 100, 90, 12)


def test_mla_extend_plan_gets_the_uploaded_lengths_on_the_host(monkeypatch):
    """DeepSeek-like (MLA): one extend plan per prefill / mixed step, built from the host copies
    and shared by the layers (the one-shot mla.extend, which reads the lengths, is not called)."""
    def one_shot(*a, **k):
        raise AssertionError("serving called the one-shot mla.extend")

    monkeypatch.setattr(tskernels.mla, "extend", one_shot)
    _spy_and_run(monkeypatch, tskernels.mla, "dummy:tiny-deepseek-v3", 1, 70, 80, 8)
