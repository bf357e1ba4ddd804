"""Sampling references: greedy, and per-request temperature / top-k / top-p / min-p, seeded.

Filter order (vLLM's): probs = softmax(logits / temperature); top-k; top-p on the renormalized
survivors; min-p relative to the largest probability. Both top-k and top-p are threshold rules,
so tied tokens are kept or dropped together:
    top-k keeps p >= (k-th largest p)
    top-p keeps p >= p_(m), m the first rank (descending) whose cumulative mass reaches top_p
    min-p keeps p >= min_p * max(p)
The draw is an exponential race, argmax_i p_i / E_i with E_i ~ Exp(1), which picks i with
probability p_i / sum(p). E comes from a per-row torch.Generator seeded with mix(seed, step), so a
request's draw depends only on its own (logits, params, seed, step), never on the batch around it.
Kernels use their own RNG: they match this reference in distribution, not draw for draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SAMPLING_EPS = 1e-5  # temperature below this is greedy
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SampleOutput:
    """token_ids int64 [B]; logprobs float32 [B] of the chosen tokens under the unmodified
    log_softmax(logits); top_logprobs (values float32 [B, n], ids int64 [B, n]) or None."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_generator(seed: int, step: int) -> torch.Generator:
    """CPU generator for one request's draw at one decode step (stable across processes)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64)))
    return gen


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary (first index on ties). logits [B, V] -> int64 [B]."""
    return torch.argmax(logits, dim=-1)


def filter_mask(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Which tokens survive top-k, top-p and min-p (see module doc). probs [B, V] -> bool [B, V]."""
    batch, vocab = probs.shape
    sorted_p = probs.sort(dim=-1, descending=True).values
    k = top_k.long().to(probs.device)
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
    keep = probs >= sorted_p.gather(1, (k - 1)[:, None])
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    kept = kept / kept.sum(dim=-1, keepdim=True)
    sorted_kept = kept.sort(dim=-1, descending=True).values
    top_p = top_p.to(probs.dtype).to(probs.device)
    rank = (sorted_kept.cumsum(dim=-1) < top_p[:, None]).sum(dim=-1).clamp(max=vocab - 1)
    p_keep = kept >= sorted_kept.gather(1, rank[:, None])
    keep &= p_keep | (top_p >= 1.0)[:, None]
    min_p = min_p.to(probs.dtype).to(probs.device)
    keep &= probs >= min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return keep


def sample(
    logits: torch.Tensor,
    *,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor | None = None,
    num_logprobs: int = 0,
) -> SampleOutput:
    """Draw one token per row.

    Args:
        logits: [B, V], any float dtype (computed in float32).
        temperature: float32 [B]; < 1e-5 means greedy (argmax of the raw logits).
        top_k: int32 [B]; <= 0 (or >= V) is off.
        top_p: float32 [B]; 1 is off.
        min_p: float32 [B]; 0 is off.
        seeds: int64 [B], per-request seed.
        steps: int64 [B], per-request step counter mixed into the seed (None: all 0).
        num_logprobs: n > 0 also returns the n best (log-prob, id) of the raw distribution.
    Returns:
        SampleOutput.
    """
    batch, vocab = logits.shape
    x = logits.float()
    raw_logprobs = torch.log_softmax(x, dim=-1)
    temp = temperature.float().to(x.device)
    is_greedy = temp < SAMPLING_EPS
    probs = torch.softmax(x / torch.where(is_greedy, torch.ones_like(temp), temp)[:, None], dim=-1)
    keep = filter_mask(probs, top_k, top_p.float(), min_p.float())
    steps_list = [0] * batch if steps is None else [int(s) for s in steps.tolist()]
    noise = torch.empty(batch, vocab, dtype=torch.float32)
    for row, seed in enumerate(int(s) for s in seeds.tolist()):
        noise[row].exponential_(generator=row_generator(seed, steps_list[row]))
    race = torch.where(keep, probs / noise.to(x.device), torch.full_like(probs, -1.0))
    token_ids = torch.where(is_greedy, greedy(x), torch.argmax(race, dim=-1))
    logprobs = raw_logprobs.gather(1, token_ids[:, None]).squeeze(1)
    top = None
    if num_logprobs > 0:
        values, ids = raw_logprobs.topk(num_logprobs, dim=-1)
        top = (values, ids)
    return SampleOutput(token_ids=token_ids, logprobs=logprobs, top_logprobs=top)


def _valid_ids(ids: torch.Tensor, lens: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """Which entries of a padded [B, L] id history count: position < len and 0 <= id < vocab."""
    pos = torch.arange(ids.shape[1], device=ids.device)[None, :]
    ok = (ids >= 0) & (ids < vocab)
    if lens is not None:
        ok &= pos < lens.to(ids.device).long()[:, None]
    return ok


def _bincount_rows(ids: torch.Tensor, ok: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per-row occurrence counts int64 [B, V] of the valid entries of ids [B, L]."""
    idx = torch.where(ok, ids.long(), torch.full_like(ids, vocab, dtype=torch.long))
    counts = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(1, idx, torch.ones_like(idx))
    return counts[:, :vocab]


def apply_penalties(
    logits: torch.Tensor,
    *,
    output_ids: torch.Tensor | None = None,
    output_lens: torch.Tensor | None = None,
    prompt_ids: torch.Tensor | None = None,
    prompt_lens: torch.Tensor | None = None,
    repetition_penalty: torch.Tensor | None = None,
    presence_penalty: torch.Tensor | None = None,
    frequency_penalty: torch.Tensor | None = None,
    logit_bias_ids: torch.Tensor | None = None,
    logit_bias_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Penalised logits (a new tensor of logits' dtype; computed in float32, rounded once).

    Histories are padded [B, L] int32/int64 id tensors; an entry counts when its position is
    below the row's length (None: every position) and 0 <= id < V (so -1 padding works too).
    In this order, for row b and token t (c = count of t in the row's output ids):
      1. logit_bias: x += sum of the row's bias values whose id is t (duplicates add up).
      2. repetition (HF / vLLM): if t is in the prompt or the output, x = x / r if x > 0
         else x * r, r = repetition_penalty[b] (1 is off).
      3. frequency and presence (OpenAI), output tokens only: if c > 0,
         x = x - frequency_penalty[b] * c - presence_penalty[b].
    Tokens a rule does not touch keep their logit bit for bit. Parameters are float32 [B].
    """
    batch, vocab = logits.shape
    x = logits.float().clone()
    dev = x.device
    if logit_bias_ids is not None:
        ok = _valid_ids(logit_bias_ids, None, vocab)
        idx = torch.where(ok, logit_bias_ids.long(), torch.full_like(logit_bias_ids, vocab,
                                                                     dtype=torch.long))
        bias = torch.zeros(batch, vocab + 1, dtype=torch.float32, device=dev)
        bias.scatter_add_(1, idx, torch.where(ok, logit_bias_values.float(), 0.0))
        hit = _bincount_rows(logit_bias_ids, ok, vocab) > 0
        x = torch.where(hit, x + bias[:, :vocab], x)
    out_counts = None
    if output_ids is not None:
        out_counts = _bincount_rows(output_ids, _valid_ids(output_ids, output_lens, vocab), vocab)
    if repetition_penalty is not None:
        seen = torch.zeros(batch, vocab, dtype=torch.bool, device=dev)
        if out_counts is not None:
            seen |= out_counts > 0
        if prompt_ids is not None:
            seen |= _bincount_rows(prompt_ids, _valid_ids(prompt_ids, prompt_lens, vocab),
                                   vocab) > 0
        r = repetition_penalty.float().to(dev)[:, None]
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if out_counts is not None and (frequency_penalty is not None or presence_penalty is not None):
        zeros = torch.zeros(batch, dtype=torch.float32, device=dev)
        f = (zeros if frequency_penalty is None else frequency_penalty.float().to(dev))[:, None]
        p = (zeros if presence_penalty is None else presence_penalty.float().to(dev))[:, None]
        x = torch.where(out_counts > 0, x - f * out_counts.float() - p, x)
    return x.to(logits.dtype)
