"""The embedded default model, SmolLM2-135M-Instruct: it answers chat correctly, and its greedy
tokens equal HF transformers' on the same dequantized weights (float32, CPU), in a batch with a
shared chat prefix (prefix-cache hits) and a prompt longer than the chunked-prefill budget, and
again with a pool small enough to force retractions."""
from __future__ import annotations

import pytest
import torch

from serve.default_model import smollm2_dir
from serve.engine import Engine, SamplingParams

from .test_models_parity import hf_greedy

NEW_TOKENS = 32
QUESTIONS = ["What is the capital of France?", "Name three primary colors."]
LONG_TEXT = ("The history of computing spans centuries, from the abacus to mechanical "
             "calculators, punched cards, vacuum tubes, transistors and integrated circuits. ") * 3


@pytest.fixture(scope="module")
def engine():
    return Engine("default", dtype="float32", device="cpu", chunked_prefill_size=48)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()


def _chat(engine, text: str) -> list[int]:
    return list(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True,
        return_dict=True)["input_ids"])


def test_answers_chat(engine):
    out = engine.generate([_chat(engine, QUESTIONS[0])],
                          SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in out.text, out.text
    assert out.finish_reason == "stop"  # <|im_end|> is an EOS id
    assert engine.model_name == "SmolLM2-135M-Instruct"
    assert engine.tokenizer.chat_template


@pytest.fixture(scope="module")
def prompts_and_expected(engine, hf_model):
    prompts = [_chat(engine, q) for q in QUESTIONS] + [engine.tokenizer(LONG_TEXT)["input_ids"]]
    return prompts, [hf_greedy(hf_model, p, NEW_TOKENS) for p in prompts]


def test_greedy_parity_with_hf(engine, prompts_and_expected):
    prompts, expected = prompts_and_expected
    assert len(prompts[2]) > engine.token_budget
    before = engine.stats()["prefix_hit_tokens"]
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                   ignore_eos=True))
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert o.token_ids == e, f"prompt {i}: engine {o.token_ids} != HF {e}"
    assert engine.stats()["prefix_hit_tokens"] > before  # the chat system prompt is shared


def test_greedy_parity_under_retraction(prompts_and_expected):
    prompts, expected = prompts_and_expected
    small = Engine("default", dtype="float32", device="cpu", num_kv_pages=10,
                   chunked_prefill_size=48)
    outs = small.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                  ignore_eos=True))
    assert small.stats()["retractions"] > 0
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert o.token_ids == e, f"prompt {i}: engine {o.token_ids} != HF {e}"
    assert small.stats()["kv_pages_used"] == 0
