"""Reasoning parsers: split a chat completion's `<think>…</think>` part into
`reasoning_content`, incrementally (streaming) and whole (the same code, so both agree).

Parsers (`--reasoning-parser`):
  none        no split; the text is all content.
  think       Qwen3 / QwQ style: reasoning when the completion opens with `<think>` — or when
              the prompt already ends with it (templates that open the block themselves) —
              up to `</think>`; a completion without the tag is all content.
  deepseek_r1 DeepSeek-R1 style: the completion starts inside the reasoning (an opening
              `<think>` is dropped if the model writes one); everything before `</think>` is
              reasoning, all of it when the tag never comes (the completion was cut).
  auto        (the default) `think` when the tokenizer has `<think>` and `</think>` as single
              tokens (reasoning families), else `none`.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
PARSERS = ("auto", "none", "think", "deepseek_r1")


def resolve_parser(name: str | None, tokenizer) -> str | None:
    """The parser to use for this tokenizer: None (no split), 'think' or 'deepseek_r1'."""
    if name in (None, "none"):
        return None
    if name not in PARSERS:
        raise ValueError(f"--reasoning-parser: expected one of {PARSERS}, got {name!r}")
    if name != "auto":
        return name
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return "think" if OPEN in vocab and CLOSE in vocab else None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (held back)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningSplitter:
    """feed(text, final) -> (reasoning_delta, content_delta). `prompt_text` is the rendered
    prompt's tail: a prompt ending in `<think>` starts the completion inside the reasoning."""

    def __init__(self, parser: str, prompt_text: str = ""):
        if parser not in ("think", "deepseek_r1"):
            raise ValueError(f"reasoning parser: expected 'think' or 'deepseek_r1', got {parser!r}")
        opened = prompt_text.rstrip().endswith(OPEN)
        self.state = "reasoning" if parser == "deepseek_r1" or opened else "start"
        self._drop_open = self.state == "reasoning"   # a repeated <think> at the start
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(OPEN):
                    self.buf, self.state = s[len(OPEN):], "reasoning"
                    continue
                if not final and OPEN.startswith(s):   # only whitespace or a partial tag yet
                    return reasoning, content
                self.state = "content"
            elif self.state == "reasoning":
                if self._drop_open:
                    s = self.buf.lstrip()
                    if not final and OPEN.startswith(s) and s != OPEN:   # "" or "<thi"
                        return reasoning, content
                    if s.startswith(OPEN):
                        self.buf = s[len(OPEN):]
                    self._drop_open = False
                i = self.buf.find(CLOSE)
                if i >= 0:
                    reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(CLOSE):], "after"
                    continue
                keep = 0 if final else _partial_suffix(self.buf, CLOSE)
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            elif self.state == "after":   # the blank line(s) after </think> belong to neither
                self.buf = self.buf.lstrip()
                if not self.buf and not final:
                    return reasoning, content
                self.state = "content"
            else:
                content += self.buf
                self.buf = ""
                return reasoning, content
