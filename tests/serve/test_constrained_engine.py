"""Constrained decoding and logits processing inside the engine's sampling step (CPU, a tiny
random-weight Llama with the SmolLM2 tokenizer): grammars hold for every request of a mixed
batch, unconstrained requests sample exactly as without the processed ones, logit_bias and the
penalties change the logits through tskernels.sampling.apply_penalties, and the per-request
prefix-cache hit is reported."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from serve.constrained import json_schema_grammar, lark_grammar
from serve.engine import Engine, SamplingParams
from tests.serve.fake_engine import tiny_model

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["a", "b"]}},
          "required": ["n", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):   # vocab 49152: the SmolLM2 tokenizer's
    return Engine(tiny_model(tmp_path_factory), device="cpu", num_kv_pages=256, page_size=4,
                  max_model_len=512, seed=0)


def _prompt(engine, text="Hello there"):
    return engine.tokenizer.encode(text)


def test_json_schema_grammar_mixed_batch(engine):
    """Greedy and sampled requests under a schema give valid JSON; an unconstrained request in
    the same batch gives the tokens it gives alone."""
    ids = _prompt(engine)
    alone = engine.generate([ids], SamplingParams(max_tokens=24, temperature=0,
                                                  ignore_eos=True))[0].token_ids
    g = json_schema_grammar(SCHEMA)
    params = [SamplingParams(max_tokens=120, temperature=0, grammar=g),
              SamplingParams(max_tokens=120, temperature=1.0, seed=3, grammar=g),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)]
    outs = engine.generate([ids, ids, ids], params)
    for out in outs[:2]:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert outs[2].token_ids == alone


def test_lark_grammar_and_rejection(engine):
    g = lark_grammar('start: /[0-9]{6}/')
    out = engine.generate([_prompt(engine)], SamplingParams(max_tokens=30, temperature=0.8,
                                                            seed=1, grammar=g))[0]
    assert re.fullmatch(r"[0-9]{6}", out.text) and out.finish_reason == "stop"
    with pytest.raises(ValueError, match="grammar"):
        engine.add_request("bad", _prompt(engine), SamplingParams(grammar="start: nope"))
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(grammar=g, ignore_eos=True)


def test_logit_bias_and_penalties(engine):
    ids = _prompt(engine, "Count with me")
    base = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0,
                                                 ignore_eos=True))[0].token_ids
    forced = engine.generate([ids], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                   logit_bias=[(1234, 100.0)]))[0].token_ids
    assert forced == [1234] * 6
    banned = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                   logit_bias=[(base[0], -100.0)]))[0].token_ids
    assert banned[0] != base[0] and base[0] not in banned
    # a presence penalty far above the logit spread never repeats a generated token
    fresh = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                  presence_penalty=2.0,
                                                  frequency_penalty=2.0))[0].token_ids
    if len(set(base)) < len(base):   # the random model repeats itself without the penalty
        assert fresh != base
    assert len(set(fresh)) == len(fresh)
    rep = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                repetition_penalty=1e-3 + 9.9))[0].token_ids
    assert not set(rep) & set(ids) or rep != base   # prompt tokens are pushed down
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("big", ids, SamplingParams(logit_bias=[(10 ** 6, 1.0)]))


def test_cached_tokens_from_prefix_cache(engine):
    ids = _prompt(engine, "a shared system prompt that is long enough to fill pages " * 3)
    outs = []
    for rid in ("c1", "c2"):
        engine.add_request(rid, ids, SamplingParams(max_tokens=2, temperature=0))
        while engine.has_unfinished():
            outs += [o for o in engine.step() if o.request_id == rid and o.finished]
    first, second = outs
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens < len(ids) and second.cached_tokens % 4 == 0
