"""Tuning space of the Triton fused experts' aligned path, `moe.fused_experts.triton` (see
autotune.declare): the gate-up and down tiles (`triton_experts.Tiles`) per token-count bucket.

The heuristic is `triton_experts.tiles_for` (the kernel's own table), so without a table entry
a launch is what it was. fp8 weights need 128-wide K steps (one scale group), a gate-up N tile
of one quantization group and a down N tile dividing it; the pruner drops the other configs.
The decode path without alignment (triton_direct) is not part of this space. On CDNA the
heuristic is the arch's own table (`tiles_for(..., arch)`) and the AMD backend knobs
(waves_per_eu, matrix_instr_nonkdim) are declared per vendor: `launch` returns them beside the
tiles, `triton_experts.CDNA_OPTIONS` under a tuned entry's own values.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

import torch

from autotune import (BACKEND_KNOBS, KernelSpace, Space, backend_options, declare, jit_source,
                      pow2_bucket)

from ... import tuning

FP8_BLOCK = 128
QWEN3 = dict(E=128, k=8, H=2048, I=768)


def _experts():
    from . import triton_experts
    return triton_experts


def _heuristic(p: Mapping) -> dict:
    return asdict(_experts().tiles_for(p["T"], p.get("w") == "fp8", p.get("arch")))


def _buffers(stages: int, target) -> int:
    """Operand buffers in shared memory / LDS: one per stage on NVIDIA (cp.async / TMA
    pipelines); AMD's stream pipeliner keeps stages - 1 in LDS."""
    return stages if target.vendor != "amd" else max(1, stages - 1)


def _prune(cfg, p, target) -> str | None:
    fp8 = p.get("w") == "fp8"
    if fp8 and (cfg["up_k"] != FP8_BLOCK or cfg["down_k"] != FP8_BLOCK
                or cfg["up_n"] != FP8_BLOCK or FP8_BLOCK % cfg["down_n"]):
        return "fp8 weights: K tiles and the gate-up N tile of one 128 block, down N dividing it"
    elem = 1 if fp8 else 2
    up = _buffers(cfg["up_stages"], target) * (cfg["block_m"] + 2 * cfg["up_n"]) * cfg["up_k"] * elem
    down = _buffers(cfg["down_stages"], target) * (cfg["block_m"] + cfg["down_n"]) \
        * cfg["down_k"] * elem
    if max(up, down) > target.smem_bytes:
        return f"{max(up, down)} B of operand stages exceed {target.smem_bytes} B"
    up_regs = 2 * cfg["block_m"] * cfg["up_n"] // (cfg["up_warps"] * target.warp_size)
    down_regs = cfg["block_m"] * cfg["down_n"] // (cfg["down_warps"] * target.warp_size)
    if max(up_regs, down_regs) > 128:
        return f"{max(up_regs, down_regs)} fp32 accumulator registers per thread"
    if cfg["block_m"] > 16 * pow2_bucket(max(1, p["T"] * p["k"] // p["E"])) and cfg["block_m"] > 16:
        return "row blocks far larger than the tokens per expert"
    return None


def _runner(p, device):
    from tskernels_ref.moe import fused_experts as ref
    T, E, k, H, I = p["T"], p["E"], p["k"], p["H"], p["I"]
    fp8 = p.get("w") == "fp8"
    cuda = torch.device(device).type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float16
    # drawn on the device (the expert weights are ~1 GB at Qwen3-30B-A3B sizes)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(T, H, generator=g, device=device).to(dt)
    w13 = torch.randn(E, 2 * I, H, generator=g, device=device) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g, device=device) / I ** 0.5
    scales = {}
    if fp8:
        s13 = torch.rand(E, -(-2 * I // FP8_BLOCK), -(-H // FP8_BLOCK), generator=g,
                         device=device) * 0.01 + 0.005
        s2 = torch.rand(E, -(-H // FP8_BLOCK), -(-I // FP8_BLOCK), generator=g,
                        device=device) * 0.01 + 0.005
        scales = dict(w13_scale=s13, w2_scale=s2)
        w13 = (w13 * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        w2 = (w2 * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        w13, w2 = w13.to(dt), w2.to(dt)
    ids = torch.rand(T, E, generator=g, device=device).argsort(-1)[:, :k].to(torch.int32)
    weights = torch.softmax(torch.randn(T, k, generator=g, device=device), -1)
    tiles = _experts().Tiles

    def launch(cfg, _inputs):
        return _experts().experts(x, w13, w2, weights, ids, tiles=tiles(**cfg), **scales)

    def reference(_inputs):
        return ref(x.double(), w13 if fp8 else w13.double(), w2 if fp8 else w2.double(),
                   weights.double(), ids, **{n: s.double() for n, s in scales.items()})
    return tuning.TensorRunner(lambda d: (), launch, reference, device, rotate=False)


def _source():
    from . import triton_gemm
    return "\n".join(jit_source(f) for f in (triton_gemm.gate_up_kernel, triton_gemm.down_kernel))


EXPERTS = declare(KernelSpace(
    "moe.fused_experts.triton",
    Space(block_m=[16, 32, 64, 128], up_n=[32, 64, 128], up_k=[64, 128],
          down_n=[64, 128, 256], down_k=[64, 128], group_m=[1, 8], up_warps=[4, 8],
          up_stages=[2, 3, 4], down_warps=[4, 8], down_stages=[2, 3, 4]),
    key=lambda p: {"T": pow2_bucket(p["T"]), "E": p["E"], "k": p["k"], "H": p["H"],
                   "I": p["I"], "w": p.get("w", "bf16")},
    heuristic=_heuristic, prune=_prune, source=_source, runner=_runner,
    parse=tuning.parse_shape, exact=("E", "k", "H", "I"),
    # AMD CDNA: the launch's backend knobs, searched on AMD only; the heuristic's are
    # triton_experts.CDNA_OPTIONS (16x16 MFMA: decode blocks are one 16-row MFMA block)
    arch_knobs={"amd": {"waves_per_eu": [0, 1, 2], "matrix_instr_nonkdim": [16, 32]}},
    arch_defaults={"amd": {"waves_per_eu": 0, "matrix_instr_nonkdim": 16}},  # 0: the compiler picks
    example={"T": 64, "E": 8, "k": 2, "H": 2048, "I": 768, "w": "bf16"},
    shapes=tuple(dict(QWEN3, T=t, w="bf16") for t in (64, 1024, 8192))))


def launch(tokens: int, hidden: int, inter: int, num_experts: int, top_k: int, fp8: bool,
           device) -> tuple:
    """The aligned path's (tiles, backend launch options): tuned on CUDA (lookup chain), else
    `tiles_for` and no options. On CDNA the heuristic link takes the arch's own tile table."""
    te = _experts()
    if device.type != "cuda":
        return te.tiles_for(tokens, fp8), {}
    c = tuning.choice(EXPERTS, {"T": tokens, "E": num_experts, "k": top_k, "H": hidden,
                                "I": inter, "w": "fp8" if fp8 else "bf16"}, device)
    arch = te.cdna_arch(device)
    if arch is None:
        return te.Tiles(**c.config), {}
    opts = {**te.CDNA_OPTIONS, **backend_options(c.config)}
    if c.link == "heuristic":
        return te.tiles_for(tokens, fp8, arch), opts  # CDNA: the arch's own table
    fields = {k: v for k, v in c.config.items() if k not in BACKEND_KNOBS}
    return te.Tiles(**fields), opts

