"""Tool-call parsers: generated text -> (content, tool calls), incrementally.

`feed(text, final)` returns the content that is certainly not part of a call and the calls
completed by this text; streaming calls it per delta, the non-streaming response once with
the whole text, so both give the same message. A call is emitted whole (name and complete
arguments in one delta) when its closing marker arrives. Text that looks like a call but is
not valid JSON naming one of the request's tools stays content, verbatim: nothing the model
wrote is dropped.

Formats (`--tool-call-parser`):
  hermes       Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
               any number of them, content around them allowed.
  llama3_json  Llama 3.1+ JSON calls: the completion is `{"name": ..., "parameters": {...}}`
               (optionally after `<|python_tag|>`), several separated by `;`; a completion
               that does not open with `{` is content.
  mistral      Mistral: the completion is `[TOOL_CALLS]` (a special token, gone from the
               text unless skip_special_tokens is false) and a JSON array of
               `{"name": ..., "arguments": {...}}`; a completion that does not open with
               `[{` or `[TOOL_CALLS]` is content.
"""
from __future__ import annotations

import json
import uuid

PARSERS = ("hermes", "llama3_json", "mistral")
_PYTHON_TAG = "<|python_tag|>"
_TOOL_CALLS = "[TOOL_CALLS]"


def _partial_suffix(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def make_call(name: str, arguments) -> dict:
    """An OpenAI tool call; arguments is a JSON string (objects are serialised)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments}}


class _Parser:
    def __init__(self, tool_names: set[str]):
        self.names = tool_names
        self.buf = ""
        self.num_calls = 0

    def _call(self, obj, args_key: str) -> dict | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) \
                or obj["name"] not in self.names:
            return None
        args = obj.get(args_key, obj.get("arguments", {}))
        if isinstance(args, str):   # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        self.num_calls += 1
        return make_call(obj["name"], args)


class HermesParser(_Parser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tool_names: set[str]):
        super().__init__(tool_names)
        self.in_call = False
        self.pending_ws = ""      # trailing whitespace, held until we know what follows it
        self.after_call = False   # whitespace right after a call is dropped

    def _emit(self, out: str) -> str:
        if self.after_call:
            out = out.lstrip()
            self.after_call = not out
        stripped = out.rstrip()
        if not stripped:
            self.pending_ws += out
            return ""
        text, self.pending_ws = self.pending_ws + stripped, out[len(stripped):]
        return text

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        content, calls = "", []
        while True:
            if not self.in_call:
                i = self.buf.find(self.OPEN)
                if i >= 0:
                    content += self._emit(self.buf[:i])
                    self.pending_ws = ""   # whitespace before a call belongs to no one
                    self.buf, self.in_call = self.buf[i + len(self.OPEN):], True
                    continue
                keep = 0 if final else _partial_suffix(self.buf, self.OPEN)
                out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                content += self._emit(out)
                if final:
                    content += self.pending_ws if self.num_calls == 0 else ""
                    self.pending_ws = ""
                return content, calls
            j = self.buf.find(self.CLOSE)
            if j < 0 and not final:
                return content, calls
            body = self.buf if j < 0 else self.buf[:j]
            self.buf = "" if j < 0 else self.buf[j + len(self.CLOSE):]
            self.in_call = False
            call = None
            try:
                call = self._call(json.loads(body), "arguments")
            except json.JSONDecodeError:
                pass
            if call is not None:
                calls.append(call)
                self.after_call = True
            else:   # not a call after all: keep the text
                content += self._emit(self.OPEN + body + ("" if j < 0 else self.CLOSE))


class Llama3JsonParser(_Parser):
    def __init__(self, tool_names: set[str]):
        super().__init__(tool_names)
        self.mode: str | None = None   # "text" or "json", once the first characters tell

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        if self.mode is None:
            s = self.buf.lstrip()
            if s.startswith(_PYTHON_TAG) or s.startswith("{"):
                self.mode = "json"
            elif not final and _PYTHON_TAG.startswith(s):
                return "", []
            else:
                self.mode = "text"
        if self.mode == "text":
            out, self.buf = self.buf, ""
            return out, []
        if not final:
            return "", []
        raw, self.buf = self.buf, ""
        calls = self._parse(raw.strip().removeprefix(_PYTHON_TAG))
        return ("", calls) if calls is not None else (raw, [])

    def _parse(self, s: str) -> list[dict] | None:
        decoder, calls, pos = json.JSONDecoder(), [], 0
        while True:
            pos = len(s) - len(s[pos:].lstrip())
            try:
                obj, pos = decoder.raw_decode(s, pos)
            except json.JSONDecodeError:
                return None
            call = self._call(obj, "parameters")
            if call is None:
                return None
            calls.append(call)
            rest = s[pos:].lstrip()
            if not rest:
                return calls
            if not rest.startswith(";"):
                return None
            pos = len(s) - len(rest) + 1


class MistralParser(_Parser):
    def __init__(self, tool_names: set[str]):
        super().__init__(tool_names)
        self.mode: str | None = None

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        if self.mode is None:
            s = self.buf.lstrip()
            if s.startswith(_TOOL_CALLS) or (s.startswith("[") and s[1:].lstrip()[:1] == "{"):
                self.mode = "json"
            elif not final and (_TOOL_CALLS.startswith(s) or s == "[" or
                                (s.startswith("[") and not s[1:].strip())):
                return "", []
            else:
                self.mode = "text"
        if self.mode == "text":
            out, self.buf = self.buf, ""
            return out, []
        if not final:
            return "", []
        raw, self.buf = self.buf, ""
        try:
            items = json.loads(raw.strip().removeprefix(_TOOL_CALLS))
        except json.JSONDecodeError:
            return raw, []
        if not isinstance(items, list) or not items:
            return raw, []
        calls = [self._call(obj, "arguments") for obj in items]
        return ("", calls) if all(c is not None for c in calls) else (raw, [])


def make_parser(name: str, tool_names: set[str]) -> _Parser:
    if name == "hermes":
        return HermesParser(tool_names)
    if name == "llama3_json":
        return Llama3JsonParser(tool_names)
    if name == "mistral":
        return MistralParser(tool_names)
    raise ValueError(f"tool-call parser: expected one of {PARSERS}, got {name!r}")
