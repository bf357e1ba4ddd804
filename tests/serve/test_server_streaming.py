"""Text assembly through the whole server, against the fake engine whose byte-level tokenizer
splits every non-ASCII character over several tokens and whose greedy output is a known script:
no broken UTF-8 in any chunk, stop strings across token boundaries, stop tokens and EOS."""
from __future__ import annotations

import openai
import pytest

from tests.serve.fake_engine import FAKE, SCRIPT, ServerProcess, make_tokenizer


@pytest.fixture(scope="module")
def client():
    server = ServerProcess("fake", *FAKE)
    yield openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    assert server.stop() == 0


def _expected(num_tokens: int) -> str:
    """The script's first `num_tokens` bytes, without a trailing incomplete character."""
    return SCRIPT.encode()[:num_tokens].decode(errors="ignore")


def test_stream_never_splits_a_character(client):
    n = len("Hello from the fake engine! 🙂 Ünïcödé 世界".encode()) - 1   # ends inside 界
    chunks = [c.choices[0].text for c in client.completions.create(
        model="fake-model", prompt="go", max_tokens=n, temperature=0, stream=True)]
    assert all("\ufffd" not in c for c in chunks)
    assert "🙂" in chunks and "世" in chunks            # released whole, by its last byte
    assert "".join(chunks) == _expected(n)
    full = client.completions.create(model="fake-model", prompt="go", max_tokens=n, temperature=0)
    assert full.choices[0].text == _expected(n) and full.usage.completion_tokens == n


@pytest.mark.parametrize("stop", ["é 世", "🙂 Ü", "fox"])
@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_multibyte_tokens(client, stop, stream):
    kw = dict(model="fake-model", prompt="go", max_tokens=200, temperature=0, stop=[stop, "zzz"])
    if stream:
        chunks = list(client.completions.create(**kw, stream=True))
        text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert text == SCRIPT[:SCRIPT.find(stop)] and finish == "stop"


def test_stop_token_id_is_not_in_the_text(client):
    bang = make_tokenizer().encode("!", add_special_tokens=False)[0]
    r = client.completions.create(model="fake-model", prompt="go", max_tokens=100, temperature=0,
                                  extra_body={"stop_token_ids": [bang]})
    assert r.choices[0].text == "Hello from the fake engine" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len("Hello from the fake engine!")


def test_eos_finishes_with_stop(client):
    r = client.chat.completions.create(model="fake-model", max_tokens=50, temperature=0,
                                       messages=[{"role": "user", "content": "[eos] please"}])
    assert r.choices[0].message.content == "Hello" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 6            # five letters + EOS
    ignored = client.chat.completions.create(model="fake-model", max_tokens=12, temperature=0,
                                             messages=[{"role": "user", "content": "[eos] please"}],
                                             extra_body={"ignore_eos": True})
    assert ignored.choices[0].finish_reason == "length"
