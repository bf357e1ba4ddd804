"""Benchmarks of the norm family against torch eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tskernels

from ..core import Bench, register_bench

SHAPES = [{"T": 1, "N": 4096}, {"T": 256, "N": 4096}, {"T": 4096, "N": 4096},
          {"T": 16384, "N": 8192}, {"T": 65536, "N": 4096}]
CPU_SHAPES = [{"T": 64, "N": 1024}]
DTYPE = torch.bfloat16


def _make(shape, device, gen, residual=False):
    x = torch.randn(shape["T"], shape["N"], device=device, generator=gen).to(DTYPE)
    d = {"x": x, "w": torch.randn(shape["N"], device=device, generator=gen).to(DTYPE)}
    if residual:
        d["r"] = torch.randn(shape["T"], shape["N"], device=device, generator=gen).to(DTYPE)
    return d


def _hf_rmsnorm(x, w, eps=1e-6):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _nbytes(shape, tensors_rw):
    return tensors_rw * shape["T"] * shape["N"] * DTYPE.itemsize + shape["N"] * DTYPE.itemsize


register_bench(Bench(
    "norm.rmsnorm", SHAPES, _make,
    ours=lambda d: tskernels.norm.rmsnorm(d["x"], d["w"]),
    baselines={"torch_eager": lambda d: _hf_rmsnorm(d["x"], d["w"]),
               "torch_F.rms_norm": lambda d: F.rms_norm(d["x"], (d["x"].shape[-1],), d["w"],
                                                        1e-6)},
    bytes=lambda s: _nbytes(s, 2), cpu_shapes=CPU_SHAPES))


def _torch_fused_add(d):
    r = d["x"] + d["r"]
    return _hf_rmsnorm(r, d["w"]), r


register_bench(Bench(
    "norm.fused_add_rmsnorm", SHAPES, lambda s, dev, g: _make(s, dev, g, residual=True),
    ours=lambda d: tskernels.norm.fused_add_rmsnorm(d["x"], d["r"], d["w"]),
    baselines={"torch_eager": _torch_fused_add},
    bytes=lambda s: _nbytes(s, 4), cpu_shapes=CPU_SHAPES))
