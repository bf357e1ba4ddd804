"""Benchmarks of the activation family against torch eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tskernels

from ..core import Bench, register_bench

DTYPE = torch.bfloat16


def _make(shape, device, gen):
    return {"x": torch.randn(shape["T"], 2 * shape["I"], device=device, generator=gen).to(DTYPE)}


def _torch(d):
    x = d["x"]
    i = x.shape[-1] // 2
    return F.silu(x[..., :i]) * x[..., i:]


register_bench(Bench(
    "activation.silu_and_mul",
    [{"T": 1, "I": 14336}, {"T": 256, "I": 14336}, {"T": 4096, "I": 14336},
     {"T": 16384, "I": 14336}],
    _make, ours=lambda d: tskernels.activation.silu_and_mul(d["x"]),
    baselines={"torch_eager": _torch},
    bytes=lambda s: 3 * s["T"] * s["I"] * DTYPE.itemsize, cpu_shapes=[{"T": 64, "I": 1024}]))
