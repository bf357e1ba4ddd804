"""Benchmark of mla.decode (absorbed, 512 + 64, page 64) against torch bmm + softmax on
contiguous latents. `H` heads (default 128, DeepSeek-V3 on one GPU; 16 is its 8-way
tensor-parallel slice, where decode is bound by the latent reads rather than the MMAs);
`fp8=1` stores the latent cache in fp8-e4m3 (per-tensor scale)."""
from __future__ import annotations

import torch

import tskernels.ops.mla as mla

from ..core import Bench, register_bench

H, DC, DR, PAGE = 128, 512, 64, 64  # H: default head count
DT = torch.bfloat16
SCALE = (128 + 64) ** -0.5


def _make(shape, device, gen):
    B, L, fp8, heads = shape["B"], shape["L"], shape.get("fp8", 0), shape.get("H", H)
    n_pages = B * (-(-L // PAGE))
    cache = torch.randn(n_pages, PAGE, DC + DR, device=device, generator=gen, dtype=DT)
    pt = torch.randperm(n_pages, device=device, generator=gen).to(torch.int32).view(B, -1)
    d = {"q": torch.randn(B, heads, DC + DR, device=device, generator=gen, dtype=DT),
         "pt": pt, "lens": torch.full((B,), L, dtype=torch.int32, device=device),
         "cont": cache[pt.long()].reshape(B, -1, DC + DR)[:, :L].contiguous()}
    if fp8:
        d["scale"] = (cache.abs().amax().float() / 448).reshape(1)
        cache = (cache.float() / d["scale"]).to(torch.float8_e4m3fn)
    d["cache"] = cache
    return d


def _prepare(d):
    d = dict(d)
    heads = d["q"].shape[1]
    d["plan"] = mla.decode_plan(d["pt"], d["lens"], num_heads=heads, kv_cache=d["cache"],
                                scale=SCALE, q_dtype=DT)
    d["out"] = torch.empty(d["q"].shape[0], heads, DC, dtype=DT, device=d["q"].device)
    return d


def _torch_bmm(d):
    kv = d["cont"]  # [B, L, 576]
    s = torch.bmm(d["q"], kv.transpose(1, 2)).float() * SCALE  # [B, H, L]
    return torch.bmm(torch.softmax(s, -1).to(DT), kv[..., :DC])


def _bytes(s):
    per = 1 if s.get("fp8", 0) else 2
    return s["B"] * s["L"] * (DC + DR) * per + s["B"] * s.get("H", H) * (DC + DR + DC) * 2


register_bench(Bench(
    "mla.decode", [{"B": b, "L": l, "fp8": f, "H": h} for h in (128, 16) for f in (0, 1)
                   for b in (1, 16, 64, 128) for l in (4096, 32768)],
    _make, ours=lambda d: d["plan"].run(d["q"], d["cache"], kv_scale=d.get("scale"),
                                        out=d["out"]),
    baselines={"torch_bmm": _torch_bmm}, bytes=_bytes,
    flops=lambda s: 2 * s["B"] * s.get("H", H) * s["L"] * (DC + DR + DC), prepare=_prepare,
    cpu_shapes=[{"B": 2, "L": 128, "fp8": 0}]))
