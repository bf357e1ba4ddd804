"""Public `apply_penalties`: logit_bias, repetition, presence and frequency penalties applied in
place to a batch of logits from per-request padded token histories (no host sync)."""
from __future__ import annotations

import numbers

import torch

from ... import _check
from ...registry import fmt, select

FloatParam = torch.Tensor | float | None


def _param(name: str, value: FloatParam, batch: int, device: torch.device, *, ok, want: str
           ) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not ok(torch.tensor(float(value))):
            raise ValueError(f"{name}: expected {want}, got {value}")
        return torch.full((batch,), float(value), dtype=torch.float32, device=device)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a [{batch}] float32 tensor, a Python float or None, "
                        f"got {type(value).__name__}")
    _check.tensor(name, value, dtypes=(torch.float32,), shape=(batch,), device=device)
    if value.device.type == "cpu" and not bool(ok(value).all()):
        raise ValueError(f"{name}: expected every value {want}, got {value.tolist()}")
    return value


def _history(name: str, ids, lens_name: str, lens, batch: int, device: torch.device
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if ids is None:
        if lens is not None:
            raise ValueError(f"{lens_name}: given without {name}")
        return None, None
    _check.tensor(name, ids, ndim=2, dtypes=_check.INDEX, shape=(batch, None), device=device)
    if lens is not None:
        _check.tensor(lens_name, lens, dtypes=_check.INDEX, shape=(batch,), device=device)
    return ids, lens


def apply_penalties(
    logits: torch.Tensor,
    *,
    output_ids: torch.Tensor | None = None,
    output_lens: torch.Tensor | None = None,
    prompt_ids: torch.Tensor | None = None,
    prompt_lens: torch.Tensor | None = None,
    repetition_penalty: FloatParam = None,
    presence_penalty: FloatParam = None,
    frequency_penalty: FloatParam = None,
    logit_bias_ids: torch.Tensor | None = None,
    logit_bias_values: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Apply logit_bias and repetition / presence / frequency penalties to logits, in place.

    logits: [B, V] fp32/fp16/bf16, last dim contiguous; modified in place and returned
    (computed in float32, rounded to logits' dtype once). Histories are fixed-size padded
    tensors, so the call never syncs with the host and can be captured in a CUDA graph:
      output_ids: int32/int64 [B, L] generated ids (frequency / presence / repetition).
      output_lens: int32/int64 [B] valid prefix of each output_ids row (None: all L).
      prompt_ids: int32/int64 [B, P] prompt ids (repetition only). prompt_lens: [B] or None.
      An entry counts when its position < the row's length and 0 <= id < V (-1 pads too).
    Per-request parameters, float32 [B] on logits' device, a Python float for every row, or
    None (off):
      repetition_penalty: > 0, 1 is off (HF / vLLM): a token seen in the prompt or the output
        has its logit divided by it when positive, multiplied by it otherwise.
      presence_penalty, frequency_penalty (OpenAI, output tokens only): a token generated
        c > 0 times gets logit - frequency_penalty * c - presence_penalty.
      logit_bias_ids: int32/int64 [B, NB], logit_bias_values: float32 [B, NB]: each valid id
        (0 <= id < V; pad with -1) gets its value added; duplicate ids add up.
    Order: logit_bias, then repetition, then frequency / presence (vLLM's order). Tokens no
    rule touches keep their logits bit for bit. Value ranges are checked for Python scalars
    and CPU tensors (a GPU tensor's values would need a sync).

    >>> import torch, tskernels
    >>> x = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    >>> _ = tskernels.sampling.apply_penalties(x, output_ids=torch.tensor([[0, 0, 1]]),
    ...     repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    >>> x.tolist()
    [[0.0, -2.75, 0.5, 3.0]]
    """
    _check.tensor("logits", logits, ndim=2, dtypes=_check.FLOAT, contiguous_last=True)
    batch, vocab = logits.shape
    dev = logits.device
    output_ids, output_lens = _history("output_ids", output_ids, "output_lens", output_lens,
                                       batch, dev)
    prompt_ids, prompt_lens = _history("prompt_ids", prompt_ids, "prompt_lens", prompt_lens,
                                       batch, dev)
    finite = lambda v: torch.isfinite(v)  # noqa: E731
    rep = _param("repetition_penalty", repetition_penalty, batch, dev,
                 ok=lambda v: torch.isfinite(v) & (v > 0), want="finite and > 0")
    pres = _param("presence_penalty", presence_penalty, batch, dev, ok=finite, want="finite")
    freq = _param("frequency_penalty", frequency_penalty, batch, dev, ok=finite, want="finite")
    if (logit_bias_ids is None) != (logit_bias_values is None):
        raise ValueError("logit_bias_ids and logit_bias_values: give both or neither")
    if logit_bias_ids is not None:
        _check.tensor("logit_bias_ids", logit_bias_ids, ndim=2, dtypes=_check.INDEX,
                      shape=(batch, None), device=dev)
        _check.tensor("logit_bias_values", logit_bias_values, dtypes=(torch.float32,),
                      shape=tuple(logit_bias_ids.shape), device=dev)
    history = output_ids is not None or prompt_ids is not None
    if logit_bias_ids is None and (rep is None or not history) \
            and (output_ids is None or (pres is None and freq is None)):
        return logits  # no rule applies: skip the launch
    kern = select("sampling", "apply_penalties", device=dev,
                  formats={"logits": fmt(logits.dtype)}, traits={"batch": batch},
                  backend=backend)
    kern(logits, output_ids=output_ids, output_lens=output_lens, prompt_ids=prompt_ids,
         prompt_lens=prompt_lens, repetition_penalty=rep, presence_penalty=pres,
         frequency_penalty=freq, logit_bias_ids=logit_bias_ids,
         logit_bias_values=logit_bias_values)
    return logits
