"""Benchmarks of the sampling family: the sampler against the torch sort-based pipeline and a
top-k-first torch variant, greedy against torch.argmax, penalties against the reference.

Shapes: B requests over a V-token vocabulary of fp32 logits (Qwen's 151,936 by default);
per-request parameters (temperature 0.8, top-k 50, top-p 0.9, min-p 0.05 unless the shape
says otherwise) and seeds are [B] tensors, as an engine passes them."""
from __future__ import annotations

import torch

import tskernels
import tskernels_ref.sampling as ref

from ..core import Bench, register_bench

V = 151936
SHAPES = [{"B": 1, "V": V}, {"B": 64, "V": V}, {"B": 256, "V": V}]
CPU_SHAPES = [{"B": 4, "V": 4096}]


def _make(shape, device, gen):
    b, v = shape["B"], shape["V"]
    full = lambda x, dt: torch.full((b,), x, dtype=dt, device=device)  # noqa: E731
    return {"logits": torch.randn(b, v, device=device, generator=gen) * 3,
            "temperature": full(float(shape.get("T", 0.8)), torch.float32),
            "top_k": full(int(shape.get("k", 50)), torch.int32),
            "top_p": full(float(shape.get("p", 0.9)), torch.float32),
            "min_p": full(float(shape.get("minp", 0.05)), torch.float32),
            "seeds": torch.arange(b, device=device, dtype=torch.int64),
            "steps": torch.zeros(b, device=device, dtype=torch.int64)}


def _params(d):
    return {k: d[k] for k in ("temperature", "top_k", "top_p", "min_p", "seeds", "steps")}


def _race(probs):
    """Exponential race (graph-safe, unlike a multinomial with a host-side check)."""
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


def torch_sort_pipeline(d):
    """vLLM-style: softmax, full descending sort, top-k / top-p / min-p masks, race."""
    x = d["logits"] / d["temperature"][:, None]
    probs = x.softmax(-1)
    sp, si = probs.sort(-1, descending=True)
    kth = sp.gather(1, (d["top_k"].long() - 1).clamp(min=0)[:, None])
    sp = sp.masked_fill(sp < kth, 0.0)
    sp = sp / sp.sum(-1, keepdim=True)
    cum = sp.cumsum(-1)
    sp = sp.masked_fill(cum - sp >= d["top_p"][:, None], 0.0)
    sp = sp.masked_fill(sp < d["min_p"][:, None] * sp[:, :1], 0.0)
    return si.gather(1, _race(sp)[:, None])[:, 0]


def torch_topk_first(d, k_max=50):
    """torch.topk with the batch's largest k first, then the same filters on k columns."""
    vals, ids = d["logits"].topk(k_max, dim=-1)
    x = vals / d["temperature"][:, None]
    keep_k = torch.arange(k_max, device=x.device)[None, :] < d["top_k"][:, None]
    probs = x.masked_fill(~keep_k, float("-inf")).softmax(-1)
    cum = probs.cumsum(-1)
    probs = probs.masked_fill(cum - probs >= d["top_p"][:, None], 0.0)
    # min-p is relative to the largest probability: p_i / p_max = exp(x_i - x_0)
    probs = probs.masked_fill((x - x[:, :1]).exp() < d["min_p"][:, None], 0.0)
    return ids.gather(1, _race(probs)[:, None])[:, 0]


register_bench(Bench(
    "sampling.sample", SHAPES, _make,
    ours=lambda d: tskernels.sampling.sample(d["logits"], **_params(d)).token_ids,
    baselines={"torch_sort": torch_sort_pipeline, "torch_topk_first": torch_topk_first},
    bytes=lambda s: s["B"] * s["V"] * 4, cpu_shapes=CPU_SHAPES))

register_bench(Bench(
    "sampling.greedy", SHAPES, _make,
    ours=lambda d: tskernels.sampling.greedy(d["logits"]),
    baselines={"torch_argmax": lambda d: torch.argmax(d["logits"], -1)},
    bytes=lambda s: s["B"] * s["V"] * 4, cpu_shapes=CPU_SHAPES))


def _make_penalties(shape, device, gen):
    b, v = shape["B"], shape["V"]
    lo, lp, nb = int(shape.get("L", 1024)), int(shape.get("P", 2048)), int(shape.get("NB", 16))
    rand = lambda *s: torch.randint(0, v, s, device=device, generator=gen)  # noqa: E731
    f = lambda x: torch.full((b,), x, device=device)  # noqa: E731
    return {"logits": torch.randn(b, v, device=device, generator=gen),
            "output_ids": rand(b, lo), "output_lens": torch.full((b,), lo, device=device),
            "prompt_ids": rand(b, lp), "prompt_lens": torch.full((b,), lp, device=device),
            "repetition_penalty": f(1.1), "presence_penalty": f(0.5),
            "frequency_penalty": f(0.3), "logit_bias_ids": rand(b, nb),
            "logit_bias_values": torch.randn(b, nb, device=device, generator=gen)}


def _pen_args(d):
    return {k: t for k, t in d.items() if k != "logits"}


register_bench(Bench(
    "sampling.apply_penalties", [{"B": 1, "V": V}, {"B": 64, "V": V}, {"B": 256, "V": V}],
    _make_penalties,
    ours=lambda d: tskernels.sampling.apply_penalties(d["logits"], **_pen_args(d)),
    baselines={"torch_reference": lambda d: ref.apply_penalties(d["logits"], **_pen_args(d))},
    bytes=lambda s: s["B"] * (int(s.get("L", 1024)) + int(s.get("P", 2048))) * 8 * 2,
    cpu_shapes=[{"B": 2, "V": 4096, "L": 64, "P": 64}]))
