"""The planned-kernel contract: `Plan`, `AttentionParams`, `PagedKV`, and the one-shot path.

Planned ops (attention.decode / extend, mla.decode / extend, later MoE and GDN) split the work
in two:

    plan = tskernels.attention.decode_plan(page_table, seq_lens, num_q_heads=32, k_cache=kc)
    for layer in range(num_layers):                    # once per batch, then per layer:
        o = plan.run(q[layer], kc[layer], vc[layer], out=o_buf)

A backend registers its plan factory with `register(..., plan=Factory)`; the public
`*_plan` functions call the selected kernel's factory, and the registry builds the one-shot
function (`tskernels.attention.decode(...)`: plan, then run once) from the same factory, so a
planned backend writes no wrapper of its own (`ONE_SHOT` below holds one adapter per planned op).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Plan(Protocol):
    """Per-batch decisions (split sizes, work lists, workspaces) made once; `run` per layer.

    CUDA-graph rules every `run` keeps (a captured graph replays exactly what it recorded):
    - no host synchronisation: no `.item()`, `int(tensor)`, `.cpu()`, `.tolist()`, no
      blocking copies; everything read on the host is read in the factory, at plan time;
    - no allocation when the caller passes `out=` (workspaces are made by the factory and
      owned by the plan, which must outlive any graph that captured its `run`);
    - no Python branch on tensor *data*: branch only on shapes, dtypes and the plan's fields,
      so a replay with new lengths / page tables (updated in place) takes the same path.
    The tensors the factory was given by reference (page table, lengths, indptr) may be
    updated in place between replays; the plan sees the new contents.

    An extend plan factory is given `host_qo_indptr` / `host_seq_lens` by
    `attention.extend_plan` and `mla.extend_plan`: int64 numpy arrays holding qo_indptr's and
    seq_lens's values (the caller's host copies, or the tensors read once); it reads those, not
    the tensors, so a plan built from the caller's copies syncs nothing. They are absent (None)
    on the one-shot path, where the factory reads the tensors itself (in one copy).

    `repr(plan)` names the kernel and the configuration it holds.
    """

    def run(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionParams:
    """The attention options every backend takes.

    scale: softmax scale (None: 1/sqrt(head_dim)). causal: each query sees keys up to its own
    position (extend; decode is causal by construction). sliding_window W: attend to the last
    W keys only. softcap c: logits = c * tanh(logits / c). sinks: whether a float32 [Hq] sink
    logit per head joins the softmax denominator (the tensor itself is a `run` argument).
    """

    scale: float | None = None
    causal: bool = True
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: bool = False

    def __post_init__(self):
        w, c = self.sliding_window, self.softcap
        if w is not None and not (isinstance(w, int) and not isinstance(w, bool) and w > 0):
            raise ValueError(f"sliding_window: expected a positive int or None, got {w!r}")
        if c is not None and not c > 0:
            raise ValueError(f"softcap: expected a positive cap or None, got {c!r}")

    def scale_for(self, head_dim: int) -> float:
        """The softmax scale (default 1/sqrt(head_dim))."""
        return self.scale or head_dim ** -0.5

    def plan_kwargs(self, head_dim: int, *, with_causal: bool = False) -> dict:
        """These options as a plan factory's keywords."""
        kw = dict(scale=self.scale_for(head_dim), sliding_window=self.sliding_window,
                  softcap=self.softcap)
        if with_causal:
            kw["causal"] = self.causal
        return kw

    def traits(self) -> dict[str, bool]:
        """The registry traits these options select on."""
        return {"softcap": self.softcap is not None,
                "sliding_window": self.sliding_window is not None, "sinks": bool(self.sinks)}


@dataclass(frozen=True)
class PagedKV:
    """The cache side of a paged attention batch, validated once.

    k_cache, v_cache: [num_pages, page_size, Hkv, D] (MLA: v_cache None, k_cache the latent
    cache [num_pages, page_size, width]). page_table int32 [B, max_pages]; seq_lens int32 [B]
    (tokens in the cache per request). k_scale / v_scale: float32 [1] or [Hkv] for fp8 caches.
    """

    k_cache: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    v_cache: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def __post_init__(self):
        dev = self.k_cache.device
        for name in ("page_table", "seq_lens"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != dev:
                raise ValueError(f"{name}: expected an int32 tensor on {dev}, got "
                                 f"{getattr(t, 'dtype', type(t))} on {getattr(t, 'device', '?')}")
        if self.page_table.ndim != 2 or self.seq_lens.shape != (self.page_table.shape[0],):
            raise ValueError(f"page_table [B, max_pages] and seq_lens [B] expected, got "
                             f"{tuple(self.page_table.shape)} and {tuple(self.seq_lens.shape)}")
        if self.v_cache is not None and self.v_cache.shape != self.k_cache.shape:
            raise ValueError(f"v_cache: shape {tuple(self.v_cache.shape)}, k_cache has "
                             f"{tuple(self.k_cache.shape)}")
        if (self.k_scale is None) != (self.v_scale is None) and self.v_cache is not None:
            raise ValueError("k_scale/v_scale: give both or neither")

    @property
    def batch(self) -> int:
        return self.page_table.shape[0]

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    @property
    def scale_mode(self) -> str | None:
        """"per_tensor" / "per_head" for a scaled (fp8) cache, else None."""
        if self.k_scale is None:
            return None
        return "per_tensor" if self.k_scale.numel() == 1 else "per_head"


# ---- one-shot path: plan, then run once ---------------------------------------------------

def attention_plan_kwargs(q: torch.Tensor, k_cache: torch.Tensor, scale: float,
                          sliding_window: int | None, softcap: float | None,
                          causal: bool | None = None) -> dict:
    """A paged attention plan factory's keywords, read off q [T, Hq, D] and the cache."""
    kw = dict(num_q_heads=q.shape[1], num_kv_heads=k_cache.shape[2], head_dim=q.shape[2],
              page_size=k_cache.shape[1], q_dtype=q.dtype, kv_dtype=k_cache.dtype,
              scale=scale, sliding_window=sliding_window, softcap=softcap)
    if causal is not None:
        kw["causal"] = causal
    return kw


def _attention_decode(make_plan):
    def decode(q, k_cache, v_cache, page_table, seq_lens, *, scale, sliding_window=None,
               softcap=None, sinks=None, k_scale=None, v_scale=None):
        plan = make_plan(page_table, seq_lens,
                         **attention_plan_kwargs(q, k_cache, scale, sliding_window, softcap))
        return plan.run(q, k_cache, v_cache, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return decode


def _attention_extend(make_plan):
    def extend(q, k_cache, v_cache, qo_indptr, page_table, seq_lens, *, causal=True, scale,
               sliding_window=None, softcap=None, sinks=None, k_scale=None, v_scale=None,
               k=None, v=None):
        plan = make_plan(qo_indptr, page_table, seq_lens,
                         **attention_plan_kwargs(q, k_cache, scale, sliding_window, softcap,
                                                 causal))
        return plan.run(q, k_cache, v_cache, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                        k=k, v=v)
    return extend


def _mla_decode(make_plan):
    def decode(q, kv_cache, page_table, seq_lens, *, scale, kv_lora_rank=512, kv_scale=None):
        plan = make_plan(page_table, seq_lens, num_heads=q.shape[1], kv_lora_rank=kv_lora_rank,
                         rope_dim=q.shape[2] - kv_lora_rank, page_size=kv_cache.shape[1],
                         scale=scale, kv_dtype=kv_cache.dtype, q_dtype=q.dtype)
        return plan.run(q, kv_cache, kv_scale=kv_scale)
    return decode


def _mla_extend(make_plan):
    def extend(q, kv_cache, qo_indptr, page_table, seq_lens, *, scale, causal=True,
               kv_lora_rank=512, kv_scale=None):
        plan = make_plan(qo_indptr, page_table, seq_lens, num_heads=q.shape[1],
                         kv_lora_rank=kv_lora_rank, rope_dim=q.shape[2] - kv_lora_rank,
                         page_size=kv_cache.shape[1], scale=scale, causal=causal,
                         kv_dtype=kv_cache.dtype, q_dtype=q.dtype)
        return plan.run(q, kv_cache, kv_scale=kv_scale)
    return extend


# (family, op) -> adapter(plan factory) -> the op's one-shot kernel function (the calling
# convention the public op uses for every backend of that op)
ONE_SHOT: dict[tuple[str, str], Callable[[Callable[..., Plan]], Callable[..., Any]]] = {
    ("attention", "decode"): _attention_decode,
    ("attention", "extend"): _attention_extend,
    ("mla", "decode"): _mla_decode,
    ("mla", "extend"): _mla_extend,
}


def one_shot(family: str, op: str, make_plan: Callable[..., Plan]) -> Callable[..., Any]:
    """The one-shot kernel function of a planned op built from a backend's plan factory."""
    try:
        adapter = ONE_SHOT[family, op]
    except KeyError:
        raise ValueError(f"{family}.{op}: no one-shot adapter for planned kernels; give the "
                         f"kernel function too (known: {sorted(ONE_SHOT)})") from None
    fn = adapter(make_plan)
    fn.__module__ = getattr(make_plan, "__module__", fn.__module__)
    fn.__doc__ = (make_plan.__doc__ or "").strip().split("\n")[0] or None
    fn.__qualname__ = f"{op}[one-shot {getattr(make_plan, '__qualname__', make_plan)!s}]"
    return fn


class PlanBase:
    """Base of the built-in plans: `repr` names the kernel (`KERNEL`) and the plan's
    configuration (the attributes listed in `REPR_FIELDS` that it has)."""

    KERNEL: str = "?"
    REPR_FIELDS: tuple[str, ...] = ()

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.REPR_FIELDS
                          if hasattr(self, k))
        return f"{type(self).__name__}({self.KERNEL}: {items})"
