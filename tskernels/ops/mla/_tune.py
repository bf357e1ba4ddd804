"""Tuning spaces of the Triton absorbed-MLA kernel: `mla.decode.triton` (one new token per
request, split-KV) and `mla.extend.triton` (ragged new tokens, causal). See autotune.declare.

The heuristic is MLAPlan's own choice (H200 sweeps), so without a table entry a plan is what
it was before the spaces existed. `num_splits` 0 means the plan's own split rule (about two
programs per SM). The fp32 correctness mode keeps its fixed small tiles and is not tuned.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning

DC, DR, PAGE = 512, 64, 64


def _fmt(dtype) -> str:
    return {torch.float8_e4m3fn: "fp8", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, "bf16")


def block_r(heads: int, gpu: bool = True) -> int:
    """Rows (token x head) per program: MLAPlan's rule."""
    return min(64, max(16, 1 << (heads - 1).bit_length())) if gpu else 16


def problem(heads: int, kv_dtype, batch: int, max_seq_len: int, new_tokens: int,
            nvidia: bool) -> dict:
    return {"H": heads, "kv": _fmt(kv_dtype), "B": batch, "L": max_seq_len, "T": new_tokens,
            "nvidia": nvidia}


def _heuristic(p: Mapping) -> dict:
    small = p.get("nvidia", True) and block_r(p["H"]) <= 16
    bn, nw, ns = ((32, 4, 3) if p["kv"] == "fp8" else (128, 8, 2)) if small else (64, 8, 2)
    return {"block_n": bn, "num_warps": nw, "num_stages": ns, "num_splits": 0}


def _prune(cfg, p, target) -> str | None:
    br = block_r(p["H"])
    kvb = 1 if p["kv"] == "fp8" else 2
    # estimate: the Q tile plus all but one K/V stage of latent rows (K and V are one row)
    smem = br * (DC + DR) * 2 + (cfg["num_stages"] - 1) * cfg["block_n"] * (DC + DR) * max(kvb, 2)
    if smem > target.smem_bytes:
        return f"~{smem} B of Q + latent stages exceed {target.smem_bytes} B"
    regs = br * DC // (cfg["num_warps"] * target.warp_size)
    if regs > 160:
        return f"~{regs} accumulator registers per thread"
    if p["kv"] == "fp8" and cfg["block_n"] < 32:
        return "e4m3 dots need >= 32 keys per tile"
    if cfg["num_splits"] > 1 and cfg["num_splits"] * 256 > p["L"]:
        return "splits of fewer than 256 keys"
    return None


def _runner(decode: bool):
    def runner(p, device):
        from tskernels_ref.mla import decode as ref_decode, extend as ref_extend

        from .triton import MLAPlan
        B, L, H, T = p["B"], p["L"], p["H"], 1 if decode else p["T"]
        cuda = torch.device(device).type == "cuda"
        dt = torch.bfloat16 if cuda else torch.float16
        fp8 = p["kv"] == "fp8"
        page = PAGE if L >= PAGE else 16
        n_pages = B * (-(-L // page))
        cache = torch.randn(n_pages, page, DC + DR, device=device, dtype=dt)
        pt = torch.randperm(n_pages, device=device).to(torch.int32).view(B, -1)
        lens = torch.full((B,), L, dtype=torch.int32, device=device)
        scale = None
        if fp8:
            scale = (cache.abs().amax().float() / 448).reshape(1)
            cache = (cache.float() / scale).to(torch.float8_e4m3fn)
        q = torch.randn(B * T, H, DC + DR, device=device, dtype=dt)
        qo = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=device)
        sm = (128 + 64) ** -0.5

        def launch(cfg, _inputs):
            kw = {k: v for k, v in cfg.items() if k != "num_splits"}
            plan = MLAPlan(qo, pt, lens, num_heads=H, kv_lora_rank=DC, rope_dim=DR,
                           page_size=page, scale=sm, causal=not decode,
                           max_new_tokens=1 if decode else None, kv_dtype=cache.dtype,
                           num_splits=cfg["num_splits"] or None, **kw)
            return plan.run(q, cache, kv_scale=scale)

        def reference(_inputs):
            c = cache if fp8 else cache.double()
            if decode:
                return ref_decode(q.double(), c, pt, lens, scale=sm, kv_lora_rank=DC,
                                  kv_scale=scale)
            return ref_extend(q.double(), c, qo, pt, lens, scale=sm, causal=True,
                              kv_lora_rank=DC, kv_scale=scale)
        return tuning.TensorRunner(lambda dev: (), launch, reference, device, rotate=False)
    return runner


def _space(decode: bool) -> Space:
    return Space(block_n=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1, 2, 3],
                 num_splits=[0, 1, 2, 4, 8, 16] if decode else [0])


def _key(decode: bool):
    def key(p):
        out = {"H": p["H"], "kv": p["kv"], "B": pow2_bucket(p["B"]), "L": pow2_bucket(p["L"])}
        if not decode:
            out["T"] = pow2_bucket(p["T"])
        return out
    return key


def _source():
    from .triton import _mla_kernel
    return jit_source(_mla_kernel)


# AMD CDNA: the launch's backend knobs, searched on AMD only; the heuristic's are
# triton.CDNA_OPTIONS (16x16 MFMA) and the compiler's waves_per_eu (0)
AMD = dict(arch_knobs={"amd": {"waves_per_eu": [0, 1, 2], "matrix_instr_nonkdim": [16, 32]}},
           arch_defaults={"amd": {"waves_per_eu": 0, "matrix_instr_nonkdim": 16}})

DECODE = declare(KernelSpace(
    "mla.decode.triton", _space(True), key=_key(True), heuristic=_heuristic, prune=_prune,
    source=_source, runner=_runner(True), parse=tuning.parse_shape, exact=("H",), **AMD,
    example={"H": 16, "kv": "bf16", "B": 4, "L": 4096},
    shapes=tuple({"H": h, "kv": kv, "B": b, "L": 4096}
                 for h in (16, 128) for kv in ("bf16", "fp8") for b in (1, 64))))

EXTEND = declare(KernelSpace(
    "mla.extend.triton", _space(False), key=_key(False), heuristic=_heuristic, prune=_prune,
    source=_source, runner=_runner(False), parse=tuning.parse_shape, exact=("H",), **AMD,
    example={"H": 16, "kv": "bf16", "B": 1, "L": 4096, "T": 16},
    shapes=({"H": 128, "kv": "bf16", "B": 1, "L": 4096, "T": 1024},
            {"H": 16, "kv": "bf16", "B": 1, "L": 4096, "T": 1024})))


def choice(decode: bool, device, **kw):
    """The launch config of an MLA plan through the lookup chain (a `Choice`)."""
    return tuning.choice(DECODE if decode else EXTEND, problem(**kw), device)
