"""Constrained decoding end to end with the official `openai` client: the embedded
SmolLM2-135M-Instruct on the CPU behind `python -m serve`. response_format json_object /
json_schema and tool_choice required / named must hold however the model would have answered,
streaming and not; unconstrained requests running at the same time are not affected; logit_bias
and penalties change the output; the prefix cache shows up in usage."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests.serve.fake_engine import ServerProcess

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "hobbies"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string",
                                                                  "maxLength": 40}},
                       "required": ["query"]}}}]
ARGS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def client():
    srv = ServerProcess("default", "--max-model-len", "2048")
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


def _chat(text):
    return [{"role": "user", "content": text}]


def _stream_text(client, **kw) -> tuple[str, str, dict]:
    text, finish, calls = "", None, {}
    for ch in client.chat.completions.create(**kw, stream=True):
        for c in ch.choices:
            text += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, ["", ""])
                slot[0] += tc.function.name or ""
                slot[1] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return text, finish, calls


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema(client, stream):
    kw = dict(model="default", messages=_chat("Describe a person."), max_tokens=120,
              temperature=0, response_format={"type": "json_schema", "json_schema": {
                  "name": "person", "schema": PERSON, "strict": True}})
    if stream:
        text, finish, _ = _stream_text(client, **kw)
    else:
        r = client.chat.completions.create(**kw)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_sampled(client):
    r = client.chat.completions.create(
        model="default", messages=_chat("Give me some data about Paris as JSON."),
        max_tokens=60, temperature=0.8, seed=5, n=2, response_format={"type": "json_object"})
    for c in r.choices:
        if c.finish_reason == "stop":   # a sampled object may be longer than max_tokens
            assert isinstance(json.loads(c.message.content), dict)
        else:
            assert c.finish_reason == "length" and c.message.content.lstrip().startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_and_named(client, stream):
    ask = _chat("I'd like to know what is happening in the world today.")
    for choice, names in (("required", set(ARGS)),
                          ({"type": "function", "function": {"name": "get_weather"}},
                           {"get_weather"})):
        kw = dict(model="default", messages=ask, tools=TOOLS, tool_choice=choice,
                  max_tokens=120, temperature=0, parallel_tool_calls=False)
        if stream:
            _, finish, parts = _stream_text(client, **kw)
            calls = [tuple(parts[i]) for i in sorted(parts)]
        else:
            r = client.chat.completions.create(**kw)
            finish = r.choices[0].finish_reason
            calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
            assert r.choices[0].message.content is None
        assert finish == "tool_calls" and len(calls) == 1
        name, arguments = calls[0]
        assert name in names
        jsonschema.validate(json.loads(arguments), ARGS[name])


def test_constrained_and_free_requests_together(client):
    """A request's output does not change when constrained requests share its batches."""
    free = dict(model="default", messages=_chat("Write a haiku about the sea."),
                max_tokens=40, temperature=0)
    alone = client.chat.completions.create(**free).choices[0].message.content
    constrained = dict(model="default", messages=_chat("Describe a person."), max_tokens=120,
                       temperature=0, response_format={"type": "json_schema", "json_schema": {
                           "name": "person", "schema": PERSON}})
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(client.chat.completions.create, **kw)
                for kw in (constrained, free, constrained, free)]
        results = [f.result() for f in futs]
    for r in results[0::2]:
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert [r.choices[0].message.content for r in results[1::2]] == [alone, alone]


def test_logit_bias_and_penalties_applied(client):
    kw = dict(model="default", prompt="The list of numbers: 1, 2, 3, 4,", max_tokens=12,
              temperature=0)
    base = client.completions.create(**kw).choices[0].text
    forced = client.completions.create(**kw, logit_bias={"28": 100}, extra_body={
        "return_token_ids": True}).choices[0]
    assert forced.model_extra["token_ids"] == [28] * 12
    banned = client.completions.create(**kw, logit_bias={str(t): -100 for t in range(32, 42)},
                                       extra_body={"return_token_ids": True}).choices[0]
    assert not set(banned.model_extra["token_ids"]) & set(range(32, 42))   # the digits 0-9
    for extra in (dict(frequency_penalty=2.0, presence_penalty=2.0),
                  dict(extra_body={"repetition_penalty": 2.0})):
        assert client.completions.create(**kw, **extra).choices[0].text != base


def test_cached_tokens(client):
    system = "You are a careful assistant. " * 40
    kw = dict(model="default", max_tokens=2, temperature=0,
              messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    first = client.chat.completions.create(**kw).usage
    second = client.chat.completions.create(**kw).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    assert first.prompt_tokens // 2 < second.prompt_tokens_details.cached_tokens < second.prompt_tokens
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == \
        second.prompt_tokens_details.cached_tokens


def test_completions_response_format(client):
    r = client.completions.create(model="default", prompt="A JSON record of a city:",
                                  max_tokens=80, temperature=0, extra_body={"response_format": {
                                      "type": "json_schema", "json_schema": {
                                          "name": "city", "schema": {
                                              "type": "object", "properties": {
                                                  "city": {"type": "string", "maxLength": 30}},
                                              "required": ["city"],
                                              "additionalProperties": False}}}})
    assert r.choices[0].finish_reason == "stop"
    assert set(json.loads(r.choices[0].text)) == {"city"}
