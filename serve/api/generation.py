"""One API call's generation: fans out n x prompts engine requests and turns their token
outputs into text deltas (incremental detokenization, stop strings, logprobs, metrics)."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from serve.api.engine_client import EngineClient, RequestGroup
from serve.api.protocol import GenerateSpec
from serve.detokenize import IncrementalDetokenizer, StopChecker
from serve.metrics import ServerMetrics

_SEED_MASK = (1 << 63) - 1


@dataclass
class Choice:
    index: int
    request_id: str
    prompt_token_ids: list[int]
    detok: IncrementalDetokenizer
    stop: StopChecker
    text: str = ""
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)   # (token_id, logprob, [(id, logprob)])
    finish_reason: str | None = None
    completion_tokens: int = 0
    last_token_at: float | None = None
    cached_tokens: int = 0
    chat_out: object = None             # serve.api.chat_output.ChatOutput (chat only)


@dataclass
class Delta:
    choice: Choice
    text: str
    token_ids: list                     # generated ids new in this delta
    logprobs: list                      # their logprob entries (if requested)
    finish_reason: str | None
    fields: dict | None = None          # chat: delta fields (content / reasoning / tool calls)


def sampling_params(spec: GenerateSpec, max_tokens: int, seed: int | None) -> dict:
    """The SamplingParams fields of one engine request, as plain data for the ZMQ message."""
    return dict(max_tokens=max_tokens, temperature=spec.temperature, top_p=spec.top_p,
                top_k=spec.top_k, min_p=spec.min_p, seed=seed,
                stop_token_ids=list(spec.stop_token_ids), ignore_eos=spec.ignore_eos,
                logprobs=spec.logprobs, presence_penalty=spec.presence_penalty,
                frequency_penalty=spec.frequency_penalty,
                repetition_penalty=spec.repetition_penalty,
                logit_bias=[list(b) for b in spec.logit_bias], grammar=spec.grammar)


class Generation:
    def __init__(self, client: EngineClient, tokenizer, metrics: ServerMetrics, spec: GenerateSpec,
                 prompts: list[list[int]], max_tokens: list[int], arrival: float,
                 chat_output=None):
        """chat_output: None, or a factory of a ChatOutput per choice (chat responses)."""
        self.client, self.tokenizer, self.metrics, self.spec = client, tokenizer, metrics, spec
        self.arrival = arrival
        self.id = uuid.uuid4().hex
        self.created = int(time.time())
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.choices: list[Choice] = []
        self._requests = []
        for p, prompt in enumerate(prompts):
            for i in range(spec.n):
                # Distinct derived seeds: choice i of seed s samples like a request with seed s + i.
                seed = None if spec.seed is None else (spec.seed + i) & _SEED_MASK
                choice = Choice(index=p * spec.n + i, request_id=f"{self.id}-{p * spec.n + i}",
                                prompt_token_ids=prompt,
                                detok=IncrementalDetokenizer(tokenizer, prompt, spec.skip_special_tokens),
                                stop=StopChecker(spec.stop),
                                chat_out=chat_output() if chat_output else None)
                self.choices.append(choice)
                self._requests.append((choice.request_id, prompt,
                                       sampling_params(spec, max_tokens[p], seed)))
        self._by_id = {c.request_id: c for c in self.choices}
        self._group: RequestGroup | None = None
        self._stop_ids = set(spec.stop_token_ids)

    def start(self) -> None:
        self._group = self.client.submit(self._requests)
        self.metrics.in_flight += 1
        self.metrics.prompt_tokens.inc(self.prompt_tokens)

    def close(self) -> None:
        """Aborts unfinished engine requests (client gone, error, shutdown). Idempotent."""
        if self._group is not None:
            self._group.close()
            self._group = None
            self.metrics.in_flight -= 1

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served: per prompt, the fewest any of its choices
        got (so never more than one copy of the prompt)."""
        n = self.spec.n
        return sum(min(c.cached_tokens for c in self.choices[p:p + n])
                   for p in range(0, len(self.choices), n))

    async def deltas(self) -> AsyncIterator[Delta]:
        """Yields a Delta per engine output (text may be empty while characters are incomplete)."""
        while any(c.finish_reason is None for c in self.choices):
            out = await self._group.next()
            choice = self._by_id[out["request_id"]]
            if choice.finish_reason is None:
                yield self._apply(choice, out)

    def _apply(self, choice: Choice, out: dict) -> Delta:
        now = time.monotonic()
        tokens = out["new_token_ids"]
        self._observe_latency(choice, len(tokens), now)
        entries = []
        if self.spec.logprobs is not None and out.get("logprobs") is not None:
            tops = out.get("top_logprobs") or [[] for _ in tokens]
            entries = [(t, lp, top) for t, lp, top in zip(tokens, out["logprobs"], tops)]
            choice.logprobs += entries
        choice.token_ids += tokens
        choice.completion_tokens += len(tokens)
        self.metrics.generation_tokens.inc(len(tokens))
        finished, reason = out["finished"], out["finish_reason"]
        choice.cached_tokens = max(choice.cached_tokens, out.get("cached_tokens") or 0)
        text = ""
        for j, token in enumerate(tokens):
            # The engine stops on a stop token id after emitting it; like OpenAI, its text is
            # not part of the completion.
            if not (finished and reason == "stop" and j == len(tokens) - 1 and token in self._stop_ids):
                text += choice.detok.push(token)
        if finished:
            text += choice.detok.flush()
        text = choice.stop.feed(text)
        if choice.stop.stopped:
            self._group.abort(choice.request_id)
            finished, reason = True, "stop"
        elif finished:
            text += choice.stop.flush()
        choice.text += text
        fields = choice.chat_out.feed(text, finished) if choice.chat_out is not None else None
        if fields is not None and choice.chat_out.done and not finished:
            self._group.abort(choice.request_id)   # parallel_tool_calls: false, one call made
            finished, reason = True, "stop"
        if finished:
            if choice.chat_out is not None:
                reason = choice.chat_out.finish_reason(reason)
            choice.finish_reason = reason
            self.metrics.e2e.observe(now - self.arrival)
            self.metrics.finished.inc(finish_reason=str(reason))
        return Delta(choice, text, tokens, entries, choice.finish_reason if finished else None,
                     fields)

    def _observe_latency(self, choice: Choice, num_tokens: int, now: float) -> None:
        if num_tokens == 0:
            return
        if choice.last_token_at is None:
            self.metrics.ttft.observe(now - self.arrival)
        else:
            # Tokens that arrive together (multi-token steps) share the gap evenly.
            gap = (now - choice.last_token_at) / num_tokens
            for _ in range(num_tokens):
                self.metrics.itl.observe(gap)
        choice.last_token_at = now
