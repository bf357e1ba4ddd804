"""Constrained decoding: a grammar per request, applied as a token mask in the sampling step.

Grammars are llguidance grammars (JSON text, as `llguidance.LLMatcher.grammar_from_*` builds
them). The API process builds and validates them (JSON schema, `json_object`, tool-call
formats); the engine keeps one `LLMatcher` per constrained request, asks it for the allowed
tokens before every sampled token (a bitmask computed on the host, ~10-100 us a row), applies
the mask on the logits' device, and feeds the sampled token back.

Why llguidance (not xgrammar): one abi3 wheel per platform (x86_64 and aarch64 manylinux,
any CPython >= 3.9) with no dependencies — xgrammar's wheels require torch, transformers,
triton and apache-tvm-ffi, which would pin the engine's own torch / triton; llguidance's
masks are computed lazily per step (no per-schema precompilation, so a new schema costs
~1 ms, not a compile), and it takes JSON schemas, regexes and Lark grammars with embedded
JSON schemas (`%json {...}`), which the tool-call formats need.
"""
from __future__ import annotations

import logging

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # the API process builds grammars without importing torch
    import torch

log = logging.getLogger(__name__)

BITS = 32


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as e:  # the serve extra installs it
        raise ValueError("constrained decoding needs the 'llguidance' package "
                         "(pip install 'tskernels[serve]')") from e
    return llguidance


def validate_grammar(grammar: str) -> str | None:
    """None when `grammar` (llguidance JSON text) is valid, else the error message."""
    err = _llguidance().LLMatcher.validate_grammar(grammar)
    return err or None


# Whitespace between JSON tokens: what pretty-printing needs, but bounded. Unbounded
# whitespace lets a model that prefers spaces (or a vocabulary with long runs of them) emit
# blanks until max_tokens and never close the object.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,24}"


def json_options(schema: dict | bool) -> dict | bool:
    """`schema` with llguidance's compile options (x-guidance): bounded whitespace."""
    if not isinstance(schema, dict):
        return schema
    opts = dict(schema.get("x-guidance") or {})
    opts.setdefault("whitespace_pattern", JSON_WHITESPACE)
    return {**schema, "x-guidance": opts}


def json_schema_grammar(schema: dict | bool) -> str:
    """The grammar of one JSON value matching `schema` (a JSON Schema object)."""
    return _llguidance().LLMatcher.grammar_from_json_schema(json_options(schema))


def lark_grammar(lark: str) -> str:
    return _llguidance().LLMatcher.grammar_from_lark(lark)


class GrammarTokenizer:
    """The engine tokenizer as llguidance sees it (built once, ~1 s for a 150k vocabulary).

    vocab_size is the logits' width (the model's vocab_size, which may exceed the tokenizer's:
    padded rows are never allowed). eos_token_ids end a finished grammar.
    """

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: list[int]):
        llg = _llguidance()
        self.vocab_size = vocab_size
        self.words = (vocab_size + BITS - 1) // BITS
        self._tok = llg.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size,
                                          eos_token=list(eos_token_ids))
        self._executor = llg.LLExecutor()

    def matcher(self, grammar: str) -> "Matcher":
        """A fresh matcher; ValueError naming the problem when the grammar is invalid."""
        llg = _llguidance()
        if not isinstance(grammar, str):
            raise ValueError(f"grammar: expected llguidance grammar text, got {type(grammar).__name__}")
        m = llg.LLMatcher(self._tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"grammar: {m.get_error()}")
        return Matcher(m)

    def fill_bitmask(self, matchers: list["Matcher"]) -> np.ndarray:
        # little-endian words: numpy's unpackbits(bitorder="little") on their bytes gives
        # token order (serve.constrained.apply_token_bitmask)
        """int32 [len(matchers), words]: bit t of row i set when token t is allowed."""
        mask = np.full((len(matchers), self.words), -1, dtype=np.int32)
        live = [(m.inner, i) for i, m in enumerate(matchers) if not m.inner.is_error()]
        if live:
            self._executor.unsafe_compute_mask_ptr(live, mask.ctypes.data, self.words * 4,
                                                   len(matchers))
        return mask


class Matcher:
    """One request's grammar state."""

    def __init__(self, inner):
        self.inner = inner

    def consume(self, token: int) -> bool:
        """Advance by the sampled token; False (and an error state) if the grammar forbids it."""
        # After the grammar's end only EOS is allowed, and the engine never feeds EOS back
        # (the request finishes on it); anything else is a violation.
        if self.inner.is_stopped():
            return False
        return bool(self.inner.consume_token(int(token)))

    @property
    def error(self) -> str | None:
        return self.inner.get_error() if self.inner.is_error() else None


def apply_token_bitmask(logits: torch.Tensor, bitmask: np.ndarray) -> torch.Tensor:
    """Logits with every token whose bit is clear set to -inf (out of place).

    logits: [S, V] float on any device; bitmask: int32 [S, ceil(V / 32)] host array (bit t % 32
    of word t // 32 allows token t; a row of all ones leaves its logits as they are). On the
    CPU the bits are unpacked by numpy; elsewhere the words are uploaded (V / 8 bytes a row)
    and unpacked on the device.
    """
    import torch

    rows, vocab = logits.shape
    words = (vocab + BITS - 1) // BITS
    if not isinstance(bitmask, np.ndarray) or bitmask.shape != (rows, words) \
            or bitmask.dtype != np.int32:
        raise ValueError(f"bitmask: expected an int32 numpy array [{rows}, {words}], got "
                         f"{getattr(bitmask, 'dtype', type(bitmask).__name__)} "
                         f"{list(getattr(bitmask, 'shape', ()))}")
    if logits.device.type == "cpu":
        bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1,
                             bitorder="little")[:, :vocab]
        # 0/1 bytes viewed as bool, and numpy (single-threaded) for float32: torch's parallel
        # CPU kernels wait for a second thread, ~10 ms each on a loaded machine, for 50 us of work
        allowed = np.ascontiguousarray(bits).view(np.bool_)
        if logits.dtype == torch.float32:
            return torch.from_numpy(np.where(allowed, logits.numpy(), np.float32("-inf")))
        allowed = torch.from_numpy(allowed)
    else:
        dev_mask = torch.from_numpy(bitmask).to(logits.device, non_blocking=True)
        shifts = torch.arange(BITS, device=logits.device, dtype=torch.int32)
        allowed = ((dev_mask.unsqueeze(-1) >> shifts) & 1).bool().reshape(rows, -1)[:, :vocab]
    return torch.where(allowed, logits, torch.tensor(float("-inf"), dtype=logits.dtype,
                                                       device=logits.device))
