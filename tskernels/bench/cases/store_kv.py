"""Benchmark of attention.store_kv (bf16 and fp8 caches) against torch index_put."""
from __future__ import annotations

import torch

import tskernels

from ..core import Bench, register_bench

H, D, PAGE = 8, 128, 16


def _make(shape, device, gen):
    T = shape["T"]
    fp8 = shape.get("fp8", 0)
    pages = shape.get("pages", 4 * T // PAGE + 8)
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kc = torch.zeros(pages, PAGE, H, D, device=device, dtype=cache_dtype)
    slots = torch.randperm(pages * PAGE, device=device, generator=gen)[:T]
    d = {"k": torch.randn(T, H, D, device=device, generator=gen).to(torch.bfloat16),
         "v": torch.randn(T, H, D, device=device, generator=gen).to(torch.bfloat16),
         "kc": kc, "vc": torch.zeros_like(kc), "slots": slots}
    if fp8:
        d["ks"] = torch.tensor([0.02], device=device)
        d["vs"] = torch.tensor([0.02], device=device)
    return d


def _ours(d):
    tskernels.attention.store_kv(d["k"], d["v"], d["kc"], d["vc"], d["slots"],
                                 k_scale=d.get("ks"), v_scale=d.get("vs"))


def _torch(d):
    for x, c, s in ((d["k"], d["kc"], d.get("ks")), (d["v"], d["vc"], d.get("vs"))):
        if s is not None:
            x = (x.float() / s).clamp(-448, 448)
        c.view(-1, H, D)[d["slots"]] = x.to(c.dtype)


def _bytes(s):
    out = 1 if s.get("fp8", 0) else 2
    return s["T"] * H * D * 2 * (2 + out) + s["T"] * 8


register_bench(Bench(
    "attention.store_kv", [{"T": 1}, {"T": 64}, {"T": 4096}, {"T": 65536},
                           {"T": 65536, "fp8": 1}],
    _make, ours=_ours, baselines={"torch_index_put": _torch}, bytes=_bytes,
    cpu_shapes=[{"T": 64}, {"T": 64, "fp8": 1}]))
