"""The engine never advertises a context its KV pool cannot hold (issue 17 §1)."""
from __future__ import annotations

import logging

import pytest

from serve.engine import Engine, SamplingParams


def test_defaulted_max_model_len_is_lowered_to_the_pool(caplog):
    with caplog.at_level(logging.WARNING, logger="serve.engine"):
        e = Engine("dummy:tiny-llama", device="cpu", page_size=16, num_kv_pages=4)
    assert e.kv_capacity == 64 and e.max_model_len == 64
    assert "max_model_len lowered from 4096 to 64" in caplog.text
    # a prompt of the old advertised size is refused up front, not cut after a few tokens
    with pytest.raises(ValueError, match="shorter than max_model_len"):
        e.add_request("r", [5] * 64, SamplingParams(max_tokens=4))
    out = e.generate([[5] * 40], SamplingParams(max_tokens=100, temperature=0.0,
                                                ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 64 - 40


def test_explicit_max_model_len_beyond_the_pool_is_refused():
    with pytest.raises(ValueError, match="max_model_len: 128 tokens do not fit: the KV pool "
                                         "holds 64 tokens"):
        Engine("dummy:tiny-llama", device="cpu", page_size=16, num_kv_pages=4, max_model_len=128)
    assert Engine("dummy:tiny-llama", device="cpu", page_size=16, num_kv_pages=4,
                  max_model_len=64).max_model_len == 64
