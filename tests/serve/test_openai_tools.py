"""Tool calling, reasoning_content and parameter validation through the official `openai`
client, against the fake engine (scripted replies: "[reply]TEXT[/reply]" in the prompt makes it
generate TEXT, so the parsers see exactly the text a model would write). Streaming and
non-streaming responses must agree."""
from __future__ import annotations

import json

import openai
import pytest

from tests.serve.fake_engine import FAKE, ServerProcess

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
HERMES = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')


def _server(*args):
    srv = ServerProcess("fake", *FAKE, "--max-model-len", "4096", *args)
    return srv, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client():
    srv, c = _server("--reasoning-parser", "think")
    yield c
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def llama_client():
    srv, c = _server("--tool-call-parser", "llama3_json")
    yield c
    assert srv.stop() == 0


def _ask(reply: str) -> list[dict]:
    return [{"role": "user", "content": f"[reply]{reply}[/reply]"}]


def _streamed(client, **kw) -> tuple[dict, str, list]:
    """The message a client assembles from the stream, the finish reason, the chunks."""
    content, reasoning, calls, finish = "", "", {}, None
    chunks = list(client.chat.completions.create(**kw, stream=True))
    for ch in chunks:
        for c in ch.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return {"content": content or None, "reasoning": reasoning or None,
            "calls": [calls[i] for i in sorted(calls)]}, finish, chunks


def _calls(message) -> list[dict]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls or []]


def test_hermes_tool_calls_stream_and_not(client):
    kw = dict(model="fake-model", messages=_ask(HERMES), tools=TOOLS, max_tokens=400)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me look."
    calls = _calls(msg)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    streamed, finish, _ = _streamed(client, **kw)
    assert finish == "tool_calls" and streamed["content"] == "Let me look."
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == \
        [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_stops_after_one(client, stream):
    kw = dict(model="fake-model", messages=_ask(HERMES + " and more text"), tools=TOOLS,
              max_tokens=400, parallel_tool_calls=False)
    if stream:
        msg, finish, _ = _streamed(client, **kw)
        calls = [(c["name"], json.loads(c["arguments"])) for c in msg["calls"]]
        content = msg["content"]
    else:
        r = client.chat.completions.create(**kw)
        finish, content = r.choices[0].finish_reason, r.choices[0].message.content
        calls = [(c["name"], json.loads(c["arguments"])) for c in _calls(r.choices[0].message)]
    assert finish == "tool_calls" and calls == [("get_weather", {"city": "Paris"})]
    assert content == "Let me look."


def test_text_that_is_not_a_call_stays_content(client):
    text = '<tool_call>{"name": "unknown_fn", "arguments": {}}</tool_call> and <tool_call'
    r = client.chat.completions.create(model="fake-model", messages=_ask(text), tools=TOOLS,
                                       max_tokens=400)
    assert r.choices[0].message.content == text and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_tool_choice_none_does_not_parse(client):
    r = client.chat.completions.create(model="fake-model", messages=_ask(HERMES), tools=TOOLS,
                                       tool_choice="none", max_tokens=400)
    assert r.choices[0].message.content == HERMES and not r.choices[0].message.tool_calls


def test_tool_result_round_trip(client):
    """An assistant tool call and the tool's result (role 'tool', tool_call_id) reach the
    prompt: the fake engine replies with the [reply] inside the tool result."""
    first = client.chat.completions.create(model="fake-model", messages=_ask(HERMES),
                                           tools=TOOLS, max_tokens=400).choices[0].message
    history = _ask(HERMES) + [first.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": f"[reply]result {i} seen[/reply]"}
        for i, c in enumerate(first.tool_calls)]
    r = client.chat.completions.create(model="fake-model", messages=history, tools=TOOLS,
                                       max_tokens=100)
    assert r.choices[0].message.content == "result 1 seen"
    bad = history[:-1] + [{"role": "tool", "content": "no id"}]
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model="fake-model", messages=bad, tools=TOOLS)


def test_reasoning_content(client):
    text = "<think>\nThe user wants 2+2.</think>\n\nIt is 4."
    kw = dict(model="fake-model", messages=_ask(text), max_tokens=200)
    msg = client.chat.completions.create(**kw).choices[0].message
    assert msg.content == "It is 4." and msg.reasoning_content == "\nThe user wants 2+2."
    streamed, finish, _ = _streamed(client, **kw)
    assert (streamed["content"], streamed["reasoning"]) == ("It is 4.", "\nThe user wants 2+2.")
    assert finish == "stop"
    # reasoning, then a tool call
    both = "<think>need weather</think>" + HERMES
    msg = client.chat.completions.create(model="fake-model", messages=_ask(both), tools=TOOLS,
                                         max_tokens=400).choices[0].message
    assert msg.reasoning_content == "need weather" and len(msg.tool_calls) == 2


def test_usage_cached_tokens_and_max_completion_tokens(client):
    kw = dict(model="fake-model", messages=_ask("abcdefghij"), max_completion_tokens=4)
    r = client.chat.completions.create(**kw)
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])


def test_llama3_json_calls(llama_client):
    reply = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "add", "parameters": {"a": 2}}'
    kw = dict(model="fake-model", messages=_ask(reply), tools=TOOLS, max_tokens=400)
    r = llama_client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    calls = _calls(r.choices[0].message)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Oslo"}), ("add", {"a": 2})]
    streamed, finish, _ = _streamed(llama_client, **kw)
    assert finish == "tool_calls" and [c["arguments"] for c in streamed["calls"]] == \
        [c["arguments"] for c in calls]
    plain = llama_client.chat.completions.create(model="fake-model", messages=_ask("Just text"),
                                                 tools=TOOLS, max_tokens=100)
    assert plain.choices[0].message.content == "Just text"
    assert plain.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw, param", [
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
     "tools[0].function.name"),
    (dict(tools=[{"type": "retrieval"}]), "tools[0]"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, response_format={"type": "json_object"}), "response_format"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(response_format={"type": "json_object"}, extra_body={"ignore_eos": True}),
     "ignore_eos"),
    (dict(logit_bias={"abc": 1}), "logit_bias"),
    (dict(logit_bias={"5": 101}), "logit_bias"),
    (dict(logit_bias={"99999999": 1}), "logit_bias"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
    (dict(functions=[{"name": "f"}]), "functions"),
    (dict(modalities=["text", "audio"]), "modalities"),
    (dict(store=True), "store"),
    (dict(reasoning_effort="high"), "reasoning_effort"),
    (dict(extra_body={"chat_template_kwargs": {"tools": []}}), "chat_template_kwargs"),
    (dict(extra_body={"chat_template_kwargs": [1]}), "chat_template_kwargs"),
])
def test_rejections_name_the_parameter(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake-model", messages=_ask("x"), max_tokens=5, **kw)
    assert e.value.body["param"] == param, e.value.body


def test_completions_reject_tools(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake-model", prompt="x", max_tokens=5,
                                  extra_body={"tools": TOOLS})
    assert e.value.body["param"] == "tools"


def test_ignored_fields_are_accepted(client):
    r = client.chat.completions.create(model="fake-model", messages=_ask("ok"), max_tokens=5,
                                       user="u1", metadata={"k": "v"}, store=False,
                                       parallel_tool_calls=True, service_tier="auto",
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "ok"
