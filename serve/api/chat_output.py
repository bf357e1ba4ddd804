"""A chat choice's text -> OpenAI message fields: `reasoning_content` (serve.api.reasoning),
then `tool_calls` (serve.api.tool_parsers) out of what is left, then `content`.

`feed(text, final)` gives the delta fields of a streaming chunk; the accumulated `message()`
is the non-streaming response, built from the same calls, so streaming and non-streaming
responses agree field for field.
"""
from __future__ import annotations

from serve.api.reasoning import ReasoningSplitter
from serve.api.tool_parsers import make_parser


class ChatOutput:
    def __init__(self, reasoning_parser: str | None = None, prompt_text: str = "",
                 tool_parser: str | None = None, tool_names: set[str] | None = None,
                 max_calls: int | None = None):
        """max_calls: stop after this many tool calls (1 for parallel_tool_calls: false);
        `done` turns true and the generation ends there, like at a stop string."""
        self.max_calls = max_calls
        self.done = False
        self.reasoning = ReasoningSplitter(reasoning_parser, prompt_text) \
            if reasoning_parser else None
        self.tools = make_parser(tool_parser, tool_names or set()) if tool_parser else None
        self.content = ""
        self.reasoning_content = "" if reasoning_parser else None
        self.tool_calls: list[dict] = []

    def feed(self, text: str, final: bool = False) -> dict:
        """Delta fields for `text` (possibly empty while markers are incomplete)."""
        delta = {}
        if self.done:
            return delta
        content = text
        if self.reasoning is not None:
            thought, content = self.reasoning.feed(text, final)
            if thought:
                self.reasoning_content += thought
                delta["reasoning_content"] = thought
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
            if calls and self.max_calls is not None:
                calls = calls[:self.max_calls - len(self.tool_calls)]
                self.done = len(self.tool_calls) + len(calls) >= self.max_calls
            if calls:
                first = len(self.tool_calls)
                self.tool_calls += calls
                delta["tool_calls"] = [{"index": first + i, **c} for i, c in enumerate(calls)]
        if content:
            self.content += content
            delta["content"] = content
        return delta

    def message(self) -> dict:
        msg = {"role": "assistant",
               "content": None if self.tool_calls and not self.content else self.content}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content or None
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI reports 'tool_calls' when the model stopped after calling tools."""
        return "tool_calls" if reason == "stop" and self.tool_calls else reason
