"""Per-request logits processing before sampling: logit_bias, repetition / presence /
frequency penalties (through `tskernels.sampling.apply_penalties`, on the logits' device) and
grammar masks (serve.constrained).

The engine keeps a `LogitsState` for the requests that need any of it; a step whose sampling
rows need none gets no processor, so unconstrained batches sample exactly as before (the
CUDA-graph greedy shortcut included). In a mixed batch only the rows that ask are touched:
their logits are gathered, processed and written back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import tskernels

from .constrained import GrammarTokenizer, Matcher, apply_token_bitmask
from .sampling_params import SamplingParams


@dataclass
class LogitsState:
    """What one request needs at each sampled token."""

    params: SamplingParams
    prompt_ids: list[int] | None = None          # kept only for the repetition penalty
    output_ids: list[int] = field(default_factory=list)
    matcher: Matcher | None = None

    @property
    def penalized(self) -> bool:
        p = self.params
        return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 \
            or p.frequency_penalty != 0.0 or bool(p.logit_bias)


def needs_processing(params: SamplingParams) -> bool:
    return params.grammar is not None or LogitsState(params).penalized


class LogitsProcessing:
    """The engine's registry of LogitsStates, and the per-step processor built from them.

    tokenizer_fn: returns the engine's HF tokenizer (loaded lazily: only grammars need it);
    vocab_size: the logits' width; eos_token_ids: tokens that end a finished grammar.
    """

    def __init__(self, tokenizer_fn: Callable, vocab_size: int, eos_token_ids: list[int]):
        self._tokenizer_fn, self.vocab_size = tokenizer_fn, vocab_size
        self._eos = list(eos_token_ids)
        self._grammar_tok: GrammarTokenizer | None = None

    def new_state(self, prompt_ids: list[int], params: SamplingParams) -> LogitsState | None:
        """A request's state (None when it needs no processing); ValueError for a bad grammar
        or a logit_bias id outside the vocabulary."""
        if not needs_processing(params):
            return None
        for t, _ in params.logit_bias:
            if t >= self.vocab_size:
                raise ValueError(f"logit_bias: token id {t} is outside the vocabulary "
                                 f"(size {self.vocab_size})")
        state = LogitsState(params)
        if params.repetition_penalty != 1.0:
            state.prompt_ids = np.asarray(prompt_ids).tolist()
        if params.grammar is not None:
            if self._grammar_tok is None:
                self._grammar_tok = GrammarTokenizer(self._tokenizer_fn(), self.vocab_size,
                                                     self._eos)
            state.matcher = self._grammar_tok.matcher(params.grammar)
        return state

    @staticmethod
    def on_token(state: LogitsState, token: int) -> str | None:
        """Record a sampled token; the grammar's error message if it cannot take it."""
        if state.penalized:
            state.output_ids.append(int(token))
        if state.matcher is not None and not state.matcher.consume(token):
            return state.matcher.error or f"token {token} is not allowed by the grammar"
        return None

    def processor(self, states: list[LogitsState | None]
                  ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """For the sampling rows' states (in logits row order): a function logits [S, V] ->
        processed logits [S, V], or None when no row needs processing."""
        pen = [i for i, s in enumerate(states) if s is not None and s.penalized]
        gram = [i for i, s in enumerate(states) if s is not None and s.matcher is not None]
        if not pen and not gram:
            return None
        def run(logits: torch.Tensor) -> torch.Tensor:
            # called once the forward is launched: on a GPU the host-side mask fill overlaps it
            bitmask = self._grammar_tok.fill_bitmask([states[i].matcher for i in gram]) \
                if gram else None
            if pen:   # in place: may be a CUDA graph's output buffer, so work on a copy
                logits = logits.clone()
                _penalize(logits, pen, [states[i] for i in pen])
            if gram and len(gram) == logits.shape[0]:
                logits = apply_token_bitmask(logits, bitmask)
            elif gram:
                rows = torch.tensor(gram, device=logits.device)
                logits[rows] = apply_token_bitmask(logits[rows], bitmask)
            return logits
        return run


def _padded(lists: list[list[int] | None], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(x or ()) for x in lists))
    ids = np.full((len(lists), width), -1, dtype=np.int64)
    lens = np.zeros(len(lists), dtype=np.int64)
    for i, x in enumerate(lists):
        if x:
            ids[i, :len(x)] = x
            lens[i] = len(x)
    return (torch.from_numpy(ids).to(device, non_blocking=True),
            torch.from_numpy(lens).to(device, non_blocking=True))


def _penalize(logits: torch.Tensor, rows: list[int], states: list[LogitsState]) -> None:
    """apply_penalties on the penalized rows of logits (in place)."""
    dev = logits.device
    sub = logits[torch.tensor(rows, device=dev)].contiguous()

    def col(name):
        return torch.tensor([getattr(s.params, name) for s in states], dtype=torch.float32,
                            device=dev)

    out_ids, out_lens = _padded([s.output_ids for s in states], dev)
    kw = {}
    if any(s.prompt_ids is not None for s in states):
        kw["prompt_ids"], kw["prompt_lens"] = _padded([s.prompt_ids for s in states], dev)
    if any(s.params.logit_bias for s in states):
        width = max(len(s.params.logit_bias) for s in states)
        ids = np.full((len(states), width), -1, dtype=np.int64)
        vals = np.zeros((len(states), width), dtype=np.float32)
        for i, s in enumerate(states):
            for j, (t, b) in enumerate(s.params.logit_bias):
                ids[i, j], vals[i, j] = t, b
        kw["logit_bias_ids"] = torch.from_numpy(ids).to(dev)
        kw["logit_bias_values"] = torch.from_numpy(vals).to(dev)
    tskernels.sampling.apply_penalties(
        sub, output_ids=out_ids, output_lens=out_lens,
        repetition_penalty=col("repetition_penalty"), presence_penalty=col("presence_penalty"),
        frequency_penalty=col("frequency_penalty"), **kw)
    logits[torch.tensor(rows, device=dev)] = sub
