"""Per request: the grammar that enforces `tool_choice` / `response_format`, and the chat
output parsers of its choices (reasoning split, tool-call parsing)."""
from __future__ import annotations

from functools import partial

from serve.api.chat_output import ChatOutput
from serve.api.protocol import GenerateSpec, bad
from serve.api.reasoning import OPEN
from serve.api.tools import response_grammar, tool_grammar


def prepare_grammar(spec: GenerateSpec, tool_parser: str, reasoning_parser: str | None) -> None:
    """Sets spec.grammar (llguidance text) when the output must follow one; 400s name the
    parameter whose constraint cannot be built. Chat requests on a server with a reasoning
    parser may think first: the grammar admits a <think> block before the constrained part
    (requires spec.prompt_tail: call after rendering). Runs in the tokenizer pool (a large
    schema takes milliseconds to compile)."""
    reasoning = None
    if spec.chat and reasoning_parser:
        inside = reasoning_parser == "deepseek_r1" or spec.prompt_tail.rstrip().endswith(OPEN)
        reasoning = "inside" if inside else "optional"
    grammar = None
    if spec.response_schema is not None:
        grammar = response_grammar(spec.response_schema, reasoning)
    elif spec.tools is not None:
        grammar = tool_grammar(spec.tools, tool_parser, reasoning)
    if grammar is not None and spec.ignore_eos:
        raise bad("ignore_eos", "'ignore_eos' cannot be combined with a constrained output "
                  "('response_format' or a forced 'tool_choice'): the grammar ends with EOS")
    spec.grammar = grammar


def chat_output_factory(state, spec: GenerateSpec):
    """A ChatOutput per choice: the server's reasoning parser; the tool parser when the
    request offers tools (and tool_choice is not 'none')."""
    tools = spec.tools if spec.tools is not None and spec.tools.choice != "none" else None
    return partial(ChatOutput, reasoning_parser=state.reasoning_parser,
                   prompt_text=spec.prompt_tail,
                   tool_parser=state.tool_call_parser if tools is not None else None,
                   tool_names=tools.names if tools is not None else None,
                   max_calls=None if tools is None or tools.parallel else 1)
