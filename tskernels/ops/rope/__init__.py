"""Rotary position embedding (neox / gptj pairing, partial rotary, scaled frequencies)."""
from __future__ import annotations

import torch
import tskernels_ref.rope as _ref

from ... import _check
from ...registry import fmt, select
from .._common import load_backends
from ._yarn import yarn_cos_sin_cache as _yarn_cache
from ._yarn import yarn_mscale

BACKENDS = load_backends(__name__, __path__)

STYLES = ("neox", "gptj")
SCALINGS = (None, "default", "linear", "llama3", "yarn")


def cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *,
                  scaling: dict | None = None, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """[max_position, rotary_dim] table: first half cos(p * f_i), second half sin(p * f_i),
    f_i = base^(-2i/rotary_dim). Built once per model, so it has no kernel.

    scaling (the HF config's rope scaling dict, kind under "rope_type" or "type"): None /
    "default"; "linear" (positions divided by "factor"); "llama3" (Llama-3.1 frequency remap;
    these in float64 math); "yarn" ("factor", "original_max_position_embeddings", "beta_fast",
    "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate": DeepSeek-V3 /
    Kimi-K2 style, float32 math, cos / sin scaled by the attention factor, see `yarn_mscale`).
    """
    _check.positive("max_position", max_position)
    _check.positive("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be even, got {rotary_dim}")
    kind = (scaling or {}).get("type", (scaling or {}).get("rope_type"))
    if kind not in SCALINGS:
        raise ValueError(f"scaling: rope scaling type {kind!r} not supported; expected one of "
                         f"{[k for k in SCALINGS if k]}")
    if kind == "yarn":
        return _yarn_cache(max_position, rotary_dim, base, scaling).to(dtype).to(device)
    return _ref.cos_sin_cache(max_position, rotary_dim, base, scaling=scaling,
                              dtype=dtype).to(device)


def apply_rope(q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor, *, style: str = "neox", inplace: bool = False,
               backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate the first r = cos_sin_cache.shape[1] dims of every head by the token's position.

    q: [T, Hq, D], k: [T, Hk, D] or None (fp32/fp16/bf16, last dim contiguous, r <= D).
    positions: int32/int64 [T], each in [0, cos_sin_cache.shape[0]). cos_sin_cache: fp32
    [max_position, r] from `cos_sin_cache`. style: "neox" pairs (i, i + r/2), "gptj" pairs
    (2i, 2i + 1). inplace=True rotates q and k in their own storage. Returns (q_out, k_out).
    """
    _check.one_of("style", style, STYLES)
    _check.tensor("q", q, ndim=3, dtypes=_check.FLOAT_OR_FP64, contiguous_last=True)
    T = q.shape[0]
    if k is not None:
        _check.tensor("k", k, ndim=3, dtypes=(q.dtype,), shape=(T, None, q.shape[2]),
                      device=q.device, contiguous_last=True)
    _check.tensor("positions", positions, ndim=1, dtypes=_check.INDEX, shape=(T,),
                  device=q.device)
    _check.tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=(torch.float32, torch.float64),
                  device=q.device)
    r = cos_sin_cache.shape[1]
    if r % 2 or r > q.shape[2]:
        raise ValueError(f"cos_sin_cache: width {r} must be even and <= head_dim {q.shape[2]}")
    kern = select("rope", "apply_rope", device=q.device, formats={"q": fmt(q.dtype)},
                  traits={"style": style}, backend=backend)
    return kern(q, k, positions, cos_sin_cache, style=style, inplace=inplace)
