"""Benchmarks of rope against the HF-style eager implementation."""
from __future__ import annotations

import torch

import tskernels

from ..core import Bench, register_bench

DTYPE = torch.bfloat16


def _make(shape, device, gen):
    T, D = shape["T"], shape.get("D", 128)
    cache = tskernels.rope.cos_sin_cache(shape.get("P", 8192), D, device=device)
    return {"q": torch.randn(T, shape.get("Hq", 32), D, device=device, generator=gen).to(DTYPE),
            "k": torch.randn(T, shape.get("Hk", 8), D, device=device, generator=gen).to(DTYPE),
            "pos": torch.randint(0, cache.shape[0], (T,), device=device, generator=gen),
            "cache": cache}


def _torch(d):
    cos, sin = d["cache"][d["pos"]].chunk(2, dim=-1)
    cos = torch.cat([cos, cos], -1)[:, None].to(DTYPE)
    sin = torch.cat([sin, sin], -1)[:, None].to(DTYPE)

    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    return rot(d["q"]), rot(d["k"])


def _bytes(s):
    heads = s.get("Hq", 32) + s.get("Hk", 8)
    return 2 * s["T"] * heads * s.get("D", 128) * DTYPE.itemsize + s["T"] * s.get("D", 128) * 4


register_bench(Bench(
    "rope.apply_rope", [{"T": 1}, {"T": 256}, {"T": 4096}, {"T": 32768}], _make,
    ours=lambda d: tskernels.rope.apply_rope(d["q"], d["k"], d["pos"], d["cache"]),
    baselines={"torch_eager": _torch}, bytes=_bytes, cpu_shapes=[{"T": 64}]))
