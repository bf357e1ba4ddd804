"""Reasoning and tool-call parsers: fed in arbitrary pieces (hypothesis draws the cut points)
they give exactly what they give for the whole text, and the whole-text results are right."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from serve.api.chat_output import ChatOutput
from serve.api.reasoning import ReasoningSplitter, resolve_parser
from serve.api.tool_parsers import make_parser
from serve.api.tools import parse_tools, render_chat, resolve_tool_parser, tool_grammar
from serve.constrained import validate_grammar
from tests.serve.fake_engine import make_tokenizer

NAMES = {"get_weather", "add"}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
CASES = [
    ("hermes", "Let me see.\n" + CALL + "\n" + CALL.replace('"a": 1', '"a": 2'),
     "Let me see.", [("add", {"a": 1}), ("add", {"a": 2})]),
    ("hermes", "No calls, < or <tool here.  ", "No calls, < or <tool here.  ", []),
    ("hermes", '<tool_call>{"name": "other", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "other", "arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call>', "",
     [("add", {"a": 3})]),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1}}', "", [("add", {"a": 1})]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
     '{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
     [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]),
    ("llama3_json", "Plain {text}", "Plain {text}", []),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1}} trailing',
     '{"name": "add", "parameters": {"a": 1}} trailing', []),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]', "",
     [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]),
    ("mistral", ' [ {"name": "add", "arguments": {"a": 5}}]', "", [("add", {"a": 5})]),
    ("mistral", "[1, 2] is a list", "[1, 2] is a list", []),
    ("mistral", '[{"name": "nope", "arguments": {}}]', '[{"name": "nope", "arguments": {}}]', []),
]


def _pieces(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _run(parser, pieces):
    content, calls = "", []
    for p in pieces:
        c, k = parser.feed(p)
        content, calls = content + c, calls + k
    c, k = parser.feed("", final=True)
    return content + c, [(x["function"]["name"], json.loads(x["function"]["arguments"]))
                         for x in calls + k]


@given(st.lists(st.integers(0, 10 ** 6), max_size=12))
def test_tool_parsers_any_split(cuts):
    for name, text, content, calls in CASES:
        whole = _run(make_parser(name, NAMES), [text])
        assert whole == (content, calls), (name, text)
        assert _run(make_parser(name, NAMES), _pieces(text, cuts)) == whole


REASONING = [
    ("think", "", "<think>plan it</think>\n\nThe answer.", ("plan it", "The answer.")),
    ("think", "", "No tags <think> later", ("", "No tags <think> later")),
    ("think", "<|assistant|>\n<think>\n", "opened by the prompt</think>done",
     ("opened by the prompt", "done")),
    ("deepseek_r1", "", "reasoning first</think>answer", ("reasoning first", "answer")),
    ("deepseek_r1", "", "<think>x</think>y", ("x", "y")),
    ("deepseek_r1", "", "cut before the end </thi", ("cut before the end </thi", "")),
]


@given(st.lists(st.integers(0, 10 ** 6), max_size=12))
def test_reasoning_any_split(cuts):
    for parser, prompt, text, want in REASONING:
        s = ReasoningSplitter(parser, prompt)
        got = ["", ""]
        pieces = _pieces(text, cuts)
        for i, p in enumerate(pieces + [""]):
            r, c = s.feed(p, final=i == len(pieces))
            got[0] += r
            got[1] += c
        assert tuple(got) == want, (parser, text)


def test_chat_output_message_and_finish():
    out = ChatOutput("think", "", "hermes", NAMES)
    delta = out.feed("<think>hm</think>" + CALL, final=True)
    assert delta["reasoning_content"] == "hm" and delta["tool_calls"][0]["index"] == 0
    msg = out.message()
    assert msg["content"] is None and msg["reasoning_content"] == "hm"
    assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"
    plain = ChatOutput()
    plain.feed("hello", final=True)
    assert plain.message() == {"role": "assistant", "content": "hello"}


def test_parser_resolution_and_rendering():
    tok = make_tokenizer()   # its template knows no tools: Hermes preamble
    assert resolve_tool_parser("auto", tok) == "hermes"
    assert resolve_parser("auto", tok) is None and resolve_parser("deepseek_r1", tok) == "deepseek_r1"
    req = parse_tools({"tools": [{"type": "function", "function": {"name": "add"}}],
                       "tool_choice": "required"})
    text = render_chat(tok, [{"role": "user", "content": "hi"}], req)
    assert "<tools>" in text and '"name": "add"' in text
    for parser in ("hermes", "llama3_json", "mistral"):
        assert validate_grammar(tool_grammar(req, parser)) is None


def test_constrained_output_may_think_first():
    """With a reasoning parser the grammar admits one <think> block before the JSON (or, when
    the completion starts inside the reasoning, text up to </think>), and nothing else."""
    from transformers import AutoTokenizer

    from serve.api.tools import response_grammar
    from serve.constrained import GrammarTokenizer
    from serve.default_model import smollm2_dir

    hf = AutoTokenizer.from_pretrained(smollm2_dir())
    gt = GrammarTokenizer(hf, 49152, [hf.eos_token_id])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def accepts(reasoning, text):
        m = gt.matcher(response_grammar(schema, reasoning))
        ok = all(m.consume(t) for t in hf.encode(text, add_special_tokens=False))
        return ok and m.inner.is_accepting()

    assert accepts(None, '{"a": 1}') and not accepts(None, '<think>x</think>{"a": 1}')
    assert accepts("optional", '<think>a </ b</think>\n\n{"a": 1}')
    assert accepts("optional", '{"a": 1}')
    assert not accepts("optional", '<think>x</think>{"a": 1}</think>')
    assert not accepts("optional", 'x{"a": 1}')
    assert accepts("inside", 'plan</think>{"a": 1}') and not accepts("inside", '{"a": 1}')
