"""Benchmarks of attention.decode / attention.extend against torch SDPA on contiguous KV (the bar)
and the naive paged path (gather the pages, then SDPA). Shapes: GQA 32/8, head_dim 128,
page 16; `fp8=1` stores the cache in fp8-e4m3 (per-tensor scales; baselines then run on the
bf16 data a user without fp8 KV would hold)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tskernels.ops.attention as attn

from ..core import Bench, register_bench

HQ, HKV, D, PAGE = 32, 8, 128, 16
DT = torch.bfloat16
FP8 = torch.float8_e4m3fn


def _paged(B, L, device, gen, fp8):
    """Random bf16 K/V for B requests of L tokens in randomly permuted pages (+ fp8 copy)."""
    n_pages = B * (-(-L // PAGE))
    kc = torch.randn(n_pages, PAGE, HKV, D, device=device, generator=gen, dtype=DT)
    vc = torch.randn(n_pages, PAGE, HKV, D, device=device, generator=gen, dtype=DT)
    table = torch.randperm(n_pages, device=device, generator=gen).to(torch.int32)
    d = {"kc": kc, "vc": vc, "pt": table.view(B, -1),
         "lens": torch.full((B,), L, dtype=torch.int32, device=device)}
    if fp8:
        d["ks"] = (kc.abs().amax().float() / 448).reshape(1)
        d["vs"] = (vc.abs().amax().float() / 448).reshape(1)
        d["kc8"] = (kc.float() / d["ks"]).to(FP8)
        d["vc8"] = (vc.float() / d["vs"]).to(FP8)
    return d


def _contiguous(d, B, L):
    """[B, HKV, L, D] copies of the paged K/V (what SDPA-contiguous reads)."""
    g = lambda c: c[d["pt"].long()].reshape(B, -1, HKV, D)[:, :L].transpose(1, 2).contiguous()  # noqa: E731
    return g(d["kc"]), g(d["vc"])


def _make_decode(shape, device, gen):
    B, L, fp8 = shape["B"], shape["L"], shape.get("fp8", 0)
    d = _paged(B, L, device, gen, fp8)
    d["q"] = torch.randn(B, HQ, D, device=device, generator=gen, dtype=DT)
    d["kcont"], d["vcont"] = _contiguous(d, B, L)
    if fp8:  # the paged bf16 copy is only needed to build the contiguous one
        d["kc"], d["vc"] = d.pop("kc8"), d.pop("vc8")
    return d


_PLAN_MODULES = {"triton_decode": "triton", "triton_extend": "triton", "cuda_decode": "cuda",
                 "reference": "reference", "torch_cpu": "torch_cpu"}


def _plan_backend(plan) -> str:
    """The backend a plan belongs to (what `ours` ran), from its module."""
    mod = type(plan).__module__.rsplit(".", 1)[-1]
    if mod == "cuda_extend":
        return "cuda_paged" if getattr(plan, "paged", False) else "cuda"
    return getattr(plan, "backend", None) or _PLAN_MODULES.get(mod, mod)


def _triton_here(op: str, device) -> bool:
    import tskernels
    return tskernels.available("attention", op, "triton", device=device)


def _prepare_decode(d):
    d = dict(d)
    fp8 = d["kc"].dtype == FP8
    plans = [("plan", None)]
    if _triton_here("decode", d["q"].device):   # the side-by-side Triton rows need Triton
        plans += [("plan_separate_merge", None), ("plan_triton", "triton")]
    else:
        d["_skip"] = ("tskernels_separate_merge", "tskernels_triton")
    for name, backend in plans:
        d[name] = attn.decode_plan(d["pt"], d["lens"], num_q_heads=HQ, k_cache=d["kc"],
                                   q_dtype=DT, kv_scale_mode="per_tensor" if fp8 else None,
                                   max_seq_len=d["pt"].shape[1] * PAGE, backend=backend)
    if hasattr(d.get("plan_separate_merge"), "fused_merge"):
        d["plan_separate_merge"].fused_merge = False
    d["out"] = torch.empty_like(d["q"])
    d["_ran"] = _plan_backend(d["plan"])
    return d


def _ours_decode(d, plan="plan"):
    return d[plan].run(d["q"], d["kc"], d["vc"], k_scale=d.get("ks"), v_scale=d.get("vs"),
                       out=d["out"])


def _sdpa_contiguous_decode(d):
    q = d["q"].unsqueeze(2)  # [B, HQ, 1, D]
    return F.scaled_dot_product_attention(q, d["kcont"], d["vcont"], enable_gqa=True)


def _naive_paged_decode(d):
    B, L = d["pt"].shape[0], d["kcont"].shape[2]
    k, v = d["kc"][d["pt"].long()], d["vc"][d["pt"].long()]
    if k.dtype == FP8:
        k, v = k.to(DT) * d["ks"].to(DT), v.to(DT) * d["vs"].to(DT)
    k = k.reshape(B, -1, HKV, D)[:, :L].transpose(1, 2)
    v = v.reshape(B, -1, HKV, D)[:, :L].transpose(1, 2)
    return F.scaled_dot_product_attention(d["q"].unsqueeze(2), k, v, enable_gqa=True)


def _decode_bytes(s):
    kv = 1 if s.get("fp8", 0) else 2
    return 2 * s["B"] * s["L"] * HKV * D * kv + 2 * s["B"] * HQ * D * 2 + s["B"] * 4


DECODE_SHAPES = [{"B": b, "L": l, "fp8": f} for f in (0, 1)
                 for b, l in ((1, 4096), (16, 4096), (64, 4096), (16, 32768), (128, 8192))]

register_bench(Bench(
    "attention.decode", DECODE_SHAPES, _make_decode, ours=_ours_decode,
    baselines={"torch_sdpa_contiguous": _sdpa_contiguous_decode,
               "naive_paged": _naive_paged_decode,
               # ours with split-KV partials merged by a second launch (the previous design)
               "tskernels_separate_merge": lambda d: _ours_decode(d, "plan_separate_merge"),
               # the Triton decode side by side (ours is the CUDA kernel where the registry
               # selects it: fp8 caches on sm_89+)
               "tskernels_triton": lambda d: _ours_decode(d, "plan_triton")},
    bytes=_decode_bytes, flops=lambda s: 4 * s["B"] * HQ * s["L"] * D,
    prepare=_prepare_decode, cpu_shapes=[{"B": 2, "L": 256, "fp8": 0}]))


def _make_extend(shape, device, gen):
    """One request: `N` new tokens over a cached prefix of `P` tokens (P=0: plain prefill)."""
    n, P = shape["N"], shape.get("P", 0)
    L = n + P
    d = _paged(1, L, device, gen, 0)
    d["q"] = torch.randn(n, HQ, D, device=device, generator=gen, dtype=DT)
    d["qo"] = torch.tensor([0, n], dtype=torch.int32, device=device)
    d["kcont"], d["vcont"] = _contiguous(d, 1, L)
    # the new tokens' own K/V [N, HKV, D] (what a model hands extend next to the cache)
    d["knew"], d["vnew"] = (c[0, :, P:].transpose(0, 1).contiguous()
                            for c in (d["kcont"], d["vcont"]))
    return d


def _prepare_extend(d):
    d = dict(d)
    d["plan"] = attn.extend_plan(d["qo"], d["pt"], d["lens"], num_q_heads=HQ, k_cache=d["kc"],
                                 q_dtype=DT)
    # the Triton kernel side by side (the registry picks the CUDA one for plain prefill on
    # sm_90, where it is run-verified)
    if _triton_here("extend", d["q"].device):
        d["plan_triton"] = attn.extend_plan(d["qo"], d["pt"], d["lens"], num_q_heads=HQ,
                                            k_cache=d["kc"], q_dtype=DT, backend="triton")
    else:
        d["_skip"] = ("tskernels_triton", "tskernels_paged_only")
    d["_ran"] = _plan_backend(d["plan"])
    d["out"] = torch.empty_like(d["q"])
    d["qt"] = d["q"].transpose(0, 1).unsqueeze(0)  # [1, HQ, N, D] view for SDPA
    n, L = d["q"].shape[0], d["kcont"].shape[2]
    if n != L:
        from torch.nn.attention.bias import causal_lower_right
        d["mask"] = causal_lower_right(n, L)
    return d


def _sdpa_extend(d, k, v):
    if "mask" in d:
        return F.scaled_dot_product_attention(d["qt"], k, v, attn_mask=d["mask"],
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(d["qt"], k, v, is_causal=True, enable_gqa=True)


def _naive_paged_extend(d):
    L = d["kcont"].shape[2]
    g = lambda c: c[d["pt"].long()].reshape(1, -1, HKV, D)[:, :L].transpose(1, 2)  # noqa: E731
    return _sdpa_extend(d, g(d["kc"]), g(d["vc"]))


def _extend_flops(s):
    n, P = s["N"], s.get("P", 0)
    return 4 * HQ * D * (n * P + n * (n + 1) // 2)


register_bench(Bench(
    "attention.extend", [{"N": 4096, "P": 0}, {"N": 16384, "P": 0}, {"N": 1024, "P": 16384}],
    _make_extend, ours=lambda d: d["plan"].run(d["q"], d["kc"], d["vc"], out=d["out"],
                                               k=d["knew"], v=d["vnew"]),
    baselines={"torch_sdpa_contiguous": lambda d: _sdpa_extend(d, d["kcont"], d["vcont"]),
               "naive_paged": _naive_paged_extend,
               "tskernels_triton": lambda d: d["plan_triton"].run(
                   d["q"], d["kc"], d["vc"], out=d["out"], k=d["knew"], v=d["vnew"]),
               # the Triton kernel reading the new tokens' keys through the page table as well
               "tskernels_paged_only": lambda d: d["plan_triton"].run(d["q"], d["kc"], d["vc"],
                                                                      out=d["out"])},
    bytes=lambda s: 2 * (s["N"] + s.get("P", 0)) * HKV * D * 2 + 2 * s["N"] * HQ * D * 2,
    flops=_extend_flops, prepare=_prepare_extend, cpu_shapes=[{"N": 64, "P": 32}]))
