"""Sampling: greedy, and per-request temperature / top-k / top-p / min-p, seeded, logprobs.

Filter order (vLLM's): probs = softmax(logits / temperature) -> top-k -> top-p on the
renormalized survivors -> min-p relative to the largest probability; top-k and top-p are
threshold rules (tied tokens are kept or dropped together). A request's draw depends only on
its own (logits, parameters, seed, step). Kernels match the reference in distribution, not
draw for draw (the Triton sampler races with Philox noise keyed by (seed; token id, step), see
triton_sample.py); greedy and apply_penalties match it exactly.
"""
from __future__ import annotations

import numbers

import torch

from tskernels_ref.sampling import SampleOutput

from ... import _check
from ...registry import fmt, select
from . import reference, triton  # noqa: F401  (register backends)
from .penalties import apply_penalties

__all__ = ["SampleOutput", "apply_penalties", "greedy", "sample"]

FloatParam = torch.Tensor | float
IntParam = torch.Tensor | int


def _per_request(name: str, value, batch: int, device: torch.device, *, dtype: torch.dtype,
                 dtypes: tuple[torch.dtype, ...], integer: bool = False, ok=None,
                 want: str = "") -> torch.Tensor:
    """A per-request parameter as a [batch] tensor; a Python scalar is broadcast. `ok` checks
    values: always for a scalar, for a tensor only on the CPU (elsewhere it would sync)."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, kind) and not isinstance(value, bool):
        if ok is not None and not ok(torch.tensor(float(value))):
            raise ValueError(f"{name}: expected {want}, got {value}")
        return torch.full((batch,), value, dtype=dtype, device=device)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a [{batch}] tensor or a Python "
                        f"{'int' if integer else 'float'}, got {type(value).__name__}")
    _check.tensor(name, value, dtypes=dtypes, shape=(batch,), device=device)
    if ok is not None and value.device.type == "cpu" and not bool(ok(value).all()):
        raise ValueError(f"{name}: expected every value {want}, got {value.tolist()}")
    return value


def _logits(logits: torch.Tensor) -> None:
    _check.tensor("logits", logits, ndim=2, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    if logits.shape[1] == 0:
        raise ValueError("logits: the vocabulary dimension is empty")


def sample(logits: torch.Tensor, *, temperature: FloatParam, top_k: IntParam, top_p: FloatParam,
           min_p: FloatParam, seeds: IntParam, steps: IntParam | None = None,
           num_logprobs: int = 0, backend: str | None = None) -> SampleOutput:
    """Draw one token per row of logits.

    logits: [B, V] fp32/fp16/bf16 (computed in float32). Per-request parameters are [B]
    tensors on logits' device, or Python scalars broadcast to every row (convenience):
      temperature: float32 [B], >= 0; below 1e-5 the row is greedy (argmax of raw logits).
      top_k: int32/int64 [B]; <= 0 or >= V is off.
      top_p: float32 [B], in (0, 1]; 1 is off.
      min_p: float32 [B], in [0, 1]; 0 is off.
      seeds: int64 [B], per-request seed.
      steps: int64 [B] or None (all 0), per-request step counter mixed into the seed.
    Value ranges are checked for scalars, and for tensors only when they are on the CPU
    (checking a GPU tensor would synchronise). num_logprobs: 0 <= n <= V; n > 0 also returns
    the n best (log-prob, id) of the raw distribution.
    Returns SampleOutput(token_ids int64 [B], logprobs float32 [B] of the chosen tokens under
    log_softmax(logits), top_logprobs (float32 [B, n], int64 [B, n]) or None).

    >>> import torch, tskernels
    >>> out = tskernels.sampling.sample(torch.tensor([[0.0, 5.0, 1.0]]), temperature=0.0,
    ...                                 top_k=0, top_p=1.0, min_p=0.0, seeds=0)
    >>> out.token_ids.tolist()
    [1]
    """
    _logits(logits)
    batch, vocab = logits.shape
    dev = logits.device
    f32 = dict(dtype=torch.float32, dtypes=(torch.float32,))
    temperature = _per_request("temperature", temperature, batch, dev, **f32,
                               ok=lambda t: t >= 0, want=">= 0")
    top_k = _per_request("top_k", top_k, batch, dev, dtype=torch.int32, dtypes=_check.INDEX,
                         integer=True)
    top_p = _per_request("top_p", top_p, batch, dev, **f32, ok=lambda p: (p > 0) & (p <= 1),
                         want="in (0, 1]")
    min_p = _per_request("min_p", min_p, batch, dev, **f32, ok=lambda p: (p >= 0) & (p <= 1),
                         want="in [0, 1]")
    i64 = dict(dtype=torch.int64, dtypes=(torch.int64,), integer=True)
    seeds = _per_request("seeds", seeds, batch, dev, **i64)
    if steps is not None:
        steps = _per_request("steps", steps, batch, dev, **i64)
    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, int) \
            or not 0 <= num_logprobs <= vocab:
        raise ValueError(f"num_logprobs: expected an int in [0, {vocab}], got {num_logprobs!r}")
    kern = select("sampling", "sample", device=dev, formats={"logits": fmt(logits.dtype)},
                  traits={"logprobs": num_logprobs > 0}, backend=backend)
    return kern(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                seeds=seeds, steps=steps, num_logprobs=num_logprobs)


def greedy(logits: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """argmax over the vocabulary, first index on ties.

    logits: [B, V] fp32/fp16/bf16. Returns token ids int64 [B].
    """
    _logits(logits)
    kern = select("sampling", "greedy", device=logits.device,
                  formats={"logits": fmt(logits.dtype)}, backend=backend)
    return kern(logits)
