"""The official `openai` client against a running `python -m serve` (API mechanics).

One server per module: the real Engine with random weights in a tiny Llama shape
(`tiny_model`). Expectations are derived from the server's own greedy output (never a
hard-coded continuation).
"""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from serve.metrics import parse_prometheus
from tests.serve.fake_engine import ServerProcess, tiny_model

API_KEY = "test-key"
MAX_MODEL_LEN = 256
EXACT = {"ignore_eos": True}   # random weights may pick EOS; tests that count tokens forbid it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tiny_model(tmp_path_factory), "--max-model-len", str(MAX_MODEL_LEN),
                        "--api-key", API_KEY, "--served-model-name", "tiny-llama")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120) as c:
        yield c


def _chat(content="Tell me a story."):
    return [{"role": "user", "content": content}]


def test_models_and_health(server, client, http):
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "tiny-llama" and models[0].object == "model"
    assert http.get("/health").json() == {"status": "ok"}


def test_completion(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.index == 0
    assert choice.finish_reason in ("length", "stop") and isinstance(choice.text, str)
    assert r.usage.completion_tokens == 12 or choice.finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens > 0


def test_chat(client, model):
    r = client.chat.completions.create(model=model, messages=_chat(), max_tokens=10, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens <= 10


def test_chat_streaming_equals_non_streaming(client, model):
    kw = dict(model=model, messages=_chat("Stream please"), max_tokens=20, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["length"], ["stop"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completion_streaming(client, model):
    kw = dict(model=model, prompt="Count:", max_tokens=15, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_streaming_with_token_ids_sends_a_chunk_per_token(client, model):
    """return_token_ids: every generated id arrives in a chunk as it is made (also one whose
    text is still incomplete), and the chunks' ids and texts add up to the full response."""
    kw = dict(model=model, prompt="Count:", max_tokens=12, temperature=0,
              extra_body={"return_token_ids": True, **EXACT})
    full = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True))
    ids = [c.choices[0].model_extra["token_ids"] for c in chunks]
    assert sum(ids, []) == full.model_extra["token_ids"]
    assert sum(len(i) for i in ids[:-1]) == len(ids) - 1 and len(ids[-1]) <= 1   # one each
    assert "".join(c.choices[0].text for c in chunks) == full.text


def test_n2_distinct_seeded_choices(client, model):
    kw = dict(model=model, messages=_chat("Pick a word"), max_tokens=12, temperature=1.0, n=2, seed=11)
    r = client.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1]
    texts = [c.message.content for c in r.choices]
    assert texts[0] != texts[1]                              # distinct derived seeds
    assert [c.message.content for c in client.chat.completions.create(**kw).choices] == texts
    streamed = {0: "", 1: ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[0], streamed[1]] == texts


def test_seed_reproducible_and_temperature_zero_deterministic(client, model):
    kw = dict(model=model, prompt="Seeded", max_tokens=10, temperature=0.9, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text
    a = client.completions.create(model=model, prompt="g", max_tokens=8, temperature=0).choices[0].text
    assert a == client.completions.create(model=model, prompt="g", max_tokens=8, temperature=0).choices[0].text


def _stop_candidate(text: str) -> str:
    """A 2-char substring from the middle of `text` whose first occurrence is past the start."""
    for start in range(len(text) // 3, len(text) - 2):
        cand = text[start:start + 2]
        if cand.strip() and text.find(cand) > 0:
            return cand
    pytest.skip(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client, model, stream):
    kw = dict(model=model, prompt="Write a line", max_tokens=40, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    stop = _stop_candidate(full)
    if stream:
        chunks = list(client.completions.create(**kw, stop=[stop, "\x00never"], stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw, stop=[stop, "\x00never"])
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert text == full[:full.find(stop)] and finish == "stop"


def test_stop_token_ids(client, model):
    kw = dict(model=model, prompt="Tokens", max_tokens=10, temperature=1.0, seed=5)   # seeded: repeatable
    first = client.completions.create(**kw, extra_body={"return_token_ids": True, **EXACT}).choices[0]
    ids = first.model_extra["token_ids"]
    assert len(ids) == 10
    k = next((k for k in range(1, 10) if ids[k] not in ids[:k]), None)
    if k is None:
        pytest.skip(f"the output repeats one token: {ids}")
    r = client.completions.create(**kw, extra_body={"stop_token_ids": [ids[k]], "return_token_ids": True})
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["token_ids"] == ids[:k + 1]
    assert r.usage.completion_tokens == k + 1
    assert first.text.startswith(choice.text)


def test_completion_logprobs(client, model):
    r = client.completions.create(model=model, prompt="Logprobs", max_tokens=6, temperature=0, logprobs=2,
                                  extra_body=EXACT)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs(client, model):
    kw = dict(model=model, messages=_chat(), max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
              extra_body=EXACT)
    content = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == 5
    assert all(item.logprob <= 0 and len(item.top_logprobs) == 3 for item in content)
    # Greedy: the sampled token is the most likely alternative.
    assert all(item.logprob >= max(t.logprob for t in item.top_logprobs) - 1e-4 for item in content)
    streamed = [item for chunk in client.chat.completions.create(**kw, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for item in chunk.choices[0].logprobs.content]
    assert [i.token for i in streamed] == [i.token for i in content]
    no_lp = client.chat.completions.create(model=model, messages=_chat(), max_tokens=2)
    assert no_lp.choices[0].logprobs is None


def test_max_completion_tokens_and_sampling_knobs(client, model):
    r = client.chat.completions.create(model=model, messages=_chat(), max_completion_tokens=3,
                                       temperature=0.7, top_p=0.9, seed=3,
                                       extra_body={"top_k": 20, "min_p": 0.05})
    assert r.usage.completion_tokens <= 3
    assert r.choices[0].finish_reason in ("length", "stop")


def test_batched_completion_prompts(client, model):
    r = client.completions.create(model=model, prompt=["one", "two"], n=2, max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text        # greedy: same prompt, same text


def _metrics(http) -> dict:
    return parse_prometheus(http.get("/metrics").text)


def _wait_pool_free(http, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(http)
        if (m.get("serve_num_requests_running", 0) == 0 and m.get("serve_num_requests_waiting", 0) == 0
                and m.get("serve_kv_pages_used", 0) == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def test_client_disconnect_aborts_and_frees_pages(server, http, model):
    body = {"model": model, "prompt": "Go on forever", "max_tokens": MAX_MODEL_LEN - 16,
            "temperature": 0, "stream": True}
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        with c.stream("POST", server.url + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            data = (line for line in resp.iter_lines() if line.startswith("data: "))
            for _ in range(3):
                assert next(data)
            assert _metrics(http)["serve_kv_pages_used"] > 0     # the stream holds pages now
        # Non-streaming too: a timeout on the client side is a disconnect. n=16 choices of
        # 240 tokens keep the (fast, tiny) engine busy far longer than the client waits.
        with pytest.raises(httpx.TimeoutException):
            c.post(server.url + "/v1/completions", json={**body, "stream": False, "n": 16},
                   timeout=0.05)
    m = _wait_pool_free(http)
    assert m["serve_num_requests_running"] == 0 and m["serve_kv_pages_used"] == 0
    assert m["serve_http_requests_in_flight"] == 0


def test_metrics_exposes_latency_histograms(http):
    m = _metrics(http)
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert m[f"serve_{name}_count"] > 0
    for name in ("kv_pages_total", "kv_cache_usage_ratio", "prefix_cache_hit_rate",
                 "num_requests_running", "num_requests_waiting"):
        assert f"serve_{name}" in m


def test_api_key_required(server, model):
    body = {"model": model, "prompt": "x", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(server.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    bad_client = openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_client.models.list()
    assert httpx.get(server.url + "/health").status_code == 200     # open without a key


# --- bad input: 4xx with an OpenAI-style error body, and the server stays up ----------------

def _post(http, path, body=None, content=None):
    return http.post(path, json=body) if content is None else \
        http.post(path, content=content, headers={"Content-Type": "application/json"})


BAD_INPUTS = {
    "malformed_json": ("/v1/completions", None, b'{"prompt": "x", "max_tokens": ', 400, None),
    "body_not_object": ("/v1/completions", [1, 2], None, 400, None),
    "wrong_type_max_tokens": ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, None, 400, "max_tokens"),
    "wrong_type_messages": ("/v1/chat/completions", {"messages": "hello"}, None, 400, "messages"),
    "wrong_type_stream": ("/v1/completions", {"prompt": "x", "stream": "yes"}, None, 400, "stream"),
    "prompt_too_long": ("/v1/completions", {"prompt": "word " * (2 * MAX_MODEL_LEN)}, None, 400, "prompt"),
    "chat_prompt_too_long": ("/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "word " * (2 * MAX_MODEL_LEN)}]},
                             None, 400, "messages"),
    "max_tokens_zero": ("/v1/completions", {"prompt": "x", "max_tokens": 0}, None, 400, "max_tokens"),
    "max_tokens_negative": ("/v1/chat/completions", {"messages": _chat(), "max_tokens": -3}, None, 400,
                            "max_tokens"),
    "max_tokens_absurd": ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, None, 400, "max_tokens"),
    "max_tokens_over_context": ("/v1/completions", {"prompt": "hello", "max_tokens": MAX_MODEL_LEN},
                                None, 400, "max_tokens"),
    "temperature_negative": ("/v1/completions", {"prompt": "x", "temperature": -1}, None, 400, "temperature"),
    "top_p_zero": ("/v1/completions", {"prompt": "x", "top_p": 0}, None, 400, "top_p"),
    "top_p_above_one": ("/v1/chat/completions", {"messages": _chat(), "top_p": 1.01}, None, 400, "top_p"),
    "unknown_model": ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, None, 404, "model"),
    "empty_messages": ("/v1/chat/completions", {"messages": []}, None, 400, "messages"),
    "n_zero": ("/v1/completions", {"prompt": "x", "n": 0}, None, 400, "n"),
    "n_negative": ("/v1/chat/completions", {"messages": _chat(), "n": -1}, None, 400, "n"),
    "empty_stop_string": ("/v1/completions", {"prompt": "x", "stop": [""]}, None, 400, "stop"),
    "token_id_out_of_vocab": ("/v1/completions", {"prompt": [10**8]}, None, 400, "prompt"),
    "top_logprobs_without_logprobs": ("/v1/chat/completions", {"messages": _chat(), "top_logprobs": 2},
                                      None, 400, "top_logprobs"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_4xx_and_server_stays_up(http, case):
    path, body, content, status, param = BAD_INPUTS[case]
    r = _post(http, path, body, content)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert http.get("/health").status_code == 200
    ok = _post(http, "/v1/completions", {"prompt": "still up", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_unknown_route_and_method(http):
    assert http.get("/v1/nope").status_code == 404
    assert http.get("/v1/completions").status_code == 405
    assert "error" in http.get("/v1/nope").json()


def test_openai_client_raises_on_bad_request(client, model):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=_chat())
