"""Per-request sampling parameters and the engine's outputs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

MAX_LOGPROBS = 20
MAX_TOKENS_LIMIT = 1 << 20
MAX_LOGIT_BIAS = 1024


def _int(name, v, lo=None, hi=None):
    if isinstance(v, bool) or not isinstance(v, Integral):
        raise ValueError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: expected an int {rng}, got {v}")
    return int(v)


def _float(name, v):
    if isinstance(v, bool) or not isinstance(v, Real) or math.isnan(v):
        raise ValueError(f"{name}: expected a number, got {type(v).__name__} {v!r}")
    return float(v)


def _logit_bias(pairs) -> tuple[tuple[int, float], ...]:
    if isinstance(pairs, dict):
        pairs = pairs.items()
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
        raise ValueError(f"logit_bias: expected (token_id, bias) pairs, got {pairs!r}")
    out = []
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"logit_bias: expected (token_id, bias) pairs, got {pair!r}")
        t, b = _int("logit_bias token id", pair[0], 0), _float("logit_bias value", pair[1])
        if not -100.0 <= b <= 100.0:
            raise ValueError(f"logit_bias: bias of token {t} must be in [-100, 100], got {b}")
        out.append((t, b))
    if len(out) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(out)}")
    return tuple(out)


@dataclass
class SamplingParams:
    """vLLM-style sampling knobs.

    max_tokens >= 1; temperature >= 0 (0 = greedy); top_p in (0, 1]; top_k = -1 (off) or >= 1
    (0 is accepted as off); min_p in [0, 1]; seed: None (engine-chosen) or an int in
    [0, 2**63 - 1];
    stop_token_ids: extra token ids that finish the request (EOS always does unless ignore_eos);
    logprobs: None, or n in [0, 20]: the chosen token's logprob plus the n best alternatives.
    presence_penalty, frequency_penalty in [-2, 2] (OpenAI; 0 = off; output tokens);
    repetition_penalty in (0, 10] (HF / vLLM; 1 = off; prompt and output tokens);
    logit_bias: (token_id, bias) pairs, bias in [-100, 100], at most 1024 of them;
    grammar: None, or llguidance grammar text (serve.constrained) every sampled token must
    follow; the request ends with EOS once the grammar is complete (so not with ignore_eos).
    detokenize: whether `Engine.generate` fills the result's text (False: token ids only, no
    tokenizer needed).
    Invalid values raise ValueError naming the field.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    detokenize: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None

    def __post_init__(self):
        self.max_tokens = _int("max_tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT)
        self.temperature = _float("temperature", self.temperature)
        if not 0.0 <= self.temperature <= 1e4:
            raise ValueError(f"temperature: expected a value in [0, 10000], got {self.temperature}")
        self.top_p = _float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: expected a value in (0, 1], got {self.top_p}")
        self.top_k = _int("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k: expected -1 (off) or a positive int, got {self.top_k}")
        self.min_p = _float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p: expected a value in [0, 1], got {self.min_p}")
        if self.seed is not None:
            self.seed = _int("seed", self.seed, 0, (1 << 63) - 1)   # 63-bit sampler seeds
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids,
                                                                        "__iter__"):
            raise ValueError(f"stop_token_ids: expected a list of ints, "
                             f"got {self.stop_token_ids!r}")
        self.stop_token_ids = tuple(_int("stop_token_ids", t, 0) for t in self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize: expected a bool, got {self.detokenize!r}")
        if self.logprobs is not None:
            self.logprobs = _int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        for name in ("presence_penalty", "frequency_penalty"):
            v = _float(name, getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name}: expected a value in [-2, 2], got {v}")
            setattr(self, name, v)
        self.repetition_penalty = _float("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty: expected a value in (0, 10], "
                             f"got {self.repetition_penalty}")
        self.logit_bias = _logit_bias(self.logit_bias)
        if self.grammar is not None:
            if not isinstance(self.grammar, str) or not self.grammar:
                raise ValueError(f"grammar: expected non-empty grammar text, got {self.grammar!r}")
            if self.ignore_eos:
                raise ValueError("grammar: cannot be combined with ignore_eos (a finished "
                                 "grammar ends the request with EOS)")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


@dataclass
class RequestOutput:
    """What one engine step produced for one request (only the new tokens)."""

    request_id: str
    new_token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0     # prompt tokens served from the prefix cache (first schedule)
    error: str | None = None   # why an "abort" came from the engine itself (e.g. a grammar)
    # engine-clock (time.monotonic) seconds {"arrival", "scheduled", "first_token"}: on the
    # output that carries a request's first token (or on its last, if it never got one; keys
    # of events that did not happen are left out). Only differences are meaningful.
    timestamps: dict[str, float] | None = None


@dataclass
class GenerateOutput:
    """A finished request from `Engine.generate`: every token, its text, and the totals."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def new_token_ids(self) -> list[int]:
        return self.token_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
