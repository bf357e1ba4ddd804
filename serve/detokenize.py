"""Incremental detokenization and stop-string detection for streamed completions.

A token is not a character: byte-level BPE splits one emoji or CJK character over several
tokens, and decoding a prefix of them yields U+FFFD. `IncrementalDetokenizer` decodes a small
window of recent tokens and only releases text once the window no longer ends in U+FFFD, so the
stream never carries half a character. `StopChecker` finds stop strings that may span token
boundaries by holding back the last `len(longest stop) - 1` characters of released text.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"
# Prompt tokens that seed the decode window: enough for tokenizers (SentencePiece) whose
# decoding of a token depends on its left neighbour (leading-space handling).
_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Turns token ids, pushed one at a time, into text deltas that are whole characters.

    Keeps ids[prefix_offset:read_offset] as decoding context (already released) and
    ids[read_offset:] as pending tokens whose text is not released yet.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int] = (), skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special,
                                      clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Adds one generated token; returns the newly complete text (possibly "")."""
        self._ids.append(int(token_id))
        return self._release(final=False)

    def flush(self) -> str:
        """Releases what is still pending at the end of a generation.

        A trailing U+FFFD here is a character the generation stopped in the middle of (e.g. at
        max_tokens): it is dropped rather than sent as a broken character.
        """
        return self._release(final=True).rstrip(REPLACEMENT)

    def _release(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT) and not final):
            return ""
        delta = full_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta


class StopChecker:
    """Detects stop strings in a stream of text deltas without emitting any part of them."""

    def __init__(self, stop: list[str] = ()):
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Returns text safe to emit now; sets `stopped` when a stop string was found."""
        if self.stopped:
            return ""
        buf = self._pending + delta
        cut = min((i for i in (buf.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return buf[:cut]
        if self._hold == 0:
            self._pending = ""
            return buf
        keep = min(self._hold, len(buf))
        self._pending = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """Releases held-back text at the end of a generation that did not hit a stop string."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out
