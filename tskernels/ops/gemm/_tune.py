"""Tuning spaces of the Triton GEMMs (see autotune.declare):

- `gemm.mm.triton`: the persistent 16-bit kernel (triton_mm, M > 16);
- `gemm.gemv.triton`: the 16-bit weight-streaming kernel (triton_gemv, M <= 16);
- `gemm.fp8_block_mm.triton`: the persistent block-fp8 kernel (M > 64);
- `gemm.fp8_stream.triton`: the block-fp8 weight-streaming kernel (M <= 64).

Heuristics are the kernels' own tables (MM_CONFIGS, FP8_CONFIGS, STREAM_CONFIGS), so without a
table entry a launch is what it was. The fp8 kernels need BK == 128 (one scale group) and BN
dividing 128 (one weight block); the spaces hold only such configs. Kernel modules are
imported lazily (they import this one).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning

FP8_BLOCK = 128
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _fmt(dtype) -> str:
    return "fp16" if dtype == torch.float16 else "bf16"


def _mm():
    from . import triton_mm
    return triton_mm


def _gemv():
    from . import triton_gemv
    return triton_gemv


def _key(p: Mapping, m_key) -> dict:
    return {"M": m_key(p["M"]), "N": pow2_bucket(p["N"]), "K": pow2_bucket(p["K"]),
            "dtype": p.get("dtype", "bf16")}


def _mpad(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


# ---- pruning -----------------------------------------------------------------------------
def _tile_prune(cfg, p, target, elem: int) -> str | None:
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    # operand stages plus the 16-bit output tile of the epilogue; AMD (pointer loads, no
    # descriptor store) keeps num_stages - 1 operand tiles in LDS and no epilogue tile there
    # (compile matrix: 128 x 256 x 64 at 2 stages, 48 KB)
    if target.vendor == "amd":
        smem = max(1, cfg["num_stages"] - 1) * (bm + bn) * bk * elem
    else:
        smem = cfg["num_stages"] * (bm + bn) * bk * elem + bm * bn * 2
    ctas = cfg.get("CTAS_PER_SM", 1)  # CTAs resident together on one SM (persistent grid)
    if smem > target.smem_bytes:
        return f"{smem} B of operand stages + epilogue exceed {target.smem_bytes} B"
    if ctas > 1 and ctas * (smem + 1024) > target.smem_bytes + 1024:
        return f"{ctas} CTAs of {smem} B of shared memory do not fit one SM"
    regs = bm * bn // (cfg["num_warps"] * target.warp_size)
    if regs > (256 if target.vendor == "amd" else 128):  # CDNA: 512 VGPRs a lane (+AGPRs)
        return f"{regs} fp32 accumulator registers per thread"
    if bm * bn < 64 * 64 * (cfg["num_warps"] // 4):
        return "more warps than the tile's MMA work"
    return None


def _stream_prune(cfg, p, target, elem: int) -> str | None:
    smem = cfg["num_stages"] * (cfg["BN"] + _mpad(p["M"])) * cfg["BK"] * elem
    if smem > target.smem_bytes:
        return f"{smem} B of weight stages exceed {target.smem_bytes} B"
    if cfg["BK"] > pow2_bucket(p["K"]):
        return "a K tile wider than K"
    return None


# ---- runners -----------------------------------------------------------------------------
def _mm_runner(p, device):
    m, n, k = p["M"], p["N"], p["K"]
    dt = _DT.get(p.get("dtype", "bf16"), torch.bfloat16)
    if torch.device(device).type != "cuda":
        dt = torch.float16
    make = lambda d: (torch.randn(m, k, device=d, dtype=dt) / k ** 0.25,  # noqa: E731
                      torch.randn(n, k, device=d, dtype=dt) / k ** 0.25)

    def launch(cfg, x):
        out = torch.empty(m, n, device=x[0].device, dtype=dt)
        if m <= 16:
            return _gemv().stream_mm(x[0], x[1], out, config=cfg)
        return _mm().persistent_mm(x[0], x[1], out, config=cfg)
    return tuning.TensorRunner(make, launch, lambda x: x[0].double() @ x[1].double().T, device)


def _fp8_inputs(m, n, k, device):
    a = torch.randn(m, k, device=device)
    b = torch.randn(n, k, device=device)
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    a_s = torch.rand(m, kb, device=device) * 0.01 + 0.005
    b_s = torch.rand(nb, kb, device=device) * 0.01 + 0.005
    return (a.clamp(-448, 448).to(torch.float8_e4m3fn), a_s,
            b.clamp(-448, 448).to(torch.float8_e4m3fn), b_s)


def _fp8_runner(p, device):
    from tskernels_ref.gemm import fp8_block_mm as ref
    m, n, k = p["M"], p["N"], p["K"]

    def launch(cfg, x):
        out = torch.empty(m, n, device=x[0].device, dtype=torch.bfloat16)
        if m <= _gemv().MAX_M:
            return _gemv().stream_mm(x[0], x[2], out, x_scale=x[1], w_scale=x[3],
                                     block=FP8_BLOCK, config=cfg)
        return _mm().persistent_mm(x[0], x[2], out, a_scale=x[1], b_scale=x[3],
                                   block=FP8_BLOCK, config=cfg)

    def reference(x):
        return ref(x[0], x[1].double(), x[2], x[3].double(), out_dtype=torch.float64,
                   block=FP8_BLOCK)
    return tuning.TensorRunner(lambda d: _fp8_inputs(m, n, k, d), launch, reference, device)


# ---- spaces ------------------------------------------------------------------------------
LLAMA_PROJ = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
DSV3 = ((7168, 2048), (2112, 7168), (24576, 1536), (7168, 16384))

# AMD knobs of the persistent kernel, per arch. On a CDNA device the heuristic link takes the
# arch's own table (triton_mm.CDNA_MM_CONFIGS / CDNA_FP8_CONFIGS: tiles and knobs, see
# mm_config); these defaults are what the tables share. kpack (two K packs per LDS read)
# exists on gfx942 only: Triton deprecates it from gfx950 on.
_CDNA_KNOBS = {"amd": {"waves_per_eu": [0, 1, 2], "matrix_instr_nonkdim": [16, 32]},
               "gfx942": {"kpack": [1, 2]}}
_CDNA_DEFAULTS = {"amd": {"matrix_instr_nonkdim": 16}}

MM = declare(KernelSpace(
    "gemm.mm.triton",
    Space(BM=[64, 128], BN=[64, 128, 256], BK=[32, 64, 128], GROUP_M=[8],
          num_stages=[2, 3, 4, 5], num_warps=[4, 8]),
    key=lambda p: _key(p, pow2_bucket),
    heuristic=lambda p: _mm().mm_heuristic(p["M"], p["N"]),
    prune=lambda cfg, p, t: _tile_prune(cfg, p, t, 2),
    arch_knobs=_CDNA_KNOBS, arch_defaults=_CDNA_DEFAULTS,
    source=lambda: jit_source(_mm()._mm_kernel), runner=_mm_runner, parse=tuning.parse_shape,
    example={"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"},
    shapes=tuple({"M": 4096, "N": n, "K": k, "dtype": "bf16"} for n, k in LLAMA_PROJ)
    + ({"M": 128, "N": 4096, "K": 4096, "dtype": "bf16"},)))

GEMV = declare(KernelSpace(
    "gemm.gemv.triton",
    Space(BN=[32, 64, 128], BK=[64, 128, 256], num_stages=[2, 3, 4, 5], num_warps=[4, 8]),
    key=lambda p: _key(p, _mpad),
    heuristic=lambda p: dict(_gemv().STREAM_CONFIGS[("16bit", 16)]),
    prune=lambda cfg, p, t: "the 16-bit streaming kernel takes M <= 16" if p["M"] > 16
    else _stream_prune(cfg, p, t, 2),
    source=lambda: jit_source(_gemv()._stream_kernel), runner=_mm_runner,
    # CDNA: the heuristic link takes triton_gemv.CDNA_STREAM_CONFIGS (stream_config)
    arch_knobs={"amd": {"waves_per_eu": [0, 2, 4], "matrix_instr_nonkdim": [16]}},
    arch_defaults={"amd": {"matrix_instr_nonkdim": 16}},
    parse=tuning.parse_shape, example={"M": 1, "N": 4096, "K": 4096, "dtype": "bf16"},
    shapes=tuple({"M": m, "N": n, "K": k, "dtype": "bf16"} for m in (1, 16)
                 for n, k in LLAMA_PROJ)))

FP8_MM = declare(KernelSpace(
    "gemm.fp8_block_mm.triton",
    Space(BM=[64, 128], BN=[64, 128], BK=[FP8_BLOCK], GROUP_M=[8], num_stages=[2, 3, 4, 5],
          num_warps=[4, 8], CTAS_PER_SM=[1, 2]),
    key=lambda p: _key(p, pow2_bucket),
    heuristic=lambda p: _mm().pick(_mm().FP8_CONFIGS, p["M"]),
    prune=lambda cfg, p, t: _tile_prune(cfg, p, t, 1),
    arch_knobs=_CDNA_KNOBS, arch_defaults=_CDNA_DEFAULTS,
    source=lambda: jit_source(_mm()._mm_kernel), runner=_fp8_runner, parse=tuning.parse_shape,
    example={"M": 4096, "N": 7168, "K": 2048},
    shapes=tuple({"M": 4096, "N": n, "K": k} for n, k in DSV3)))

FP8_STREAM = declare(KernelSpace(
    "gemm.fp8_stream.triton",
    Space(BN=[32, 64, 128], BK=[FP8_BLOCK], num_stages=[2, 3, 4, 5], num_warps=[4, 8]),
    key=lambda p: _key(p, _mpad),
    heuristic=lambda p: dict(_gemv().STREAM_CONFIGS[("fp8", _mpad(p["M"]))]),
    prune=lambda cfg, p, t: "the streaming kernel takes M <= 64" if p["M"] > 64
    else _stream_prune(cfg, p, t, 1),
    source=lambda: jit_source(_gemv()._stream_kernel), runner=_fp8_runner,
    parse=tuning.parse_shape, example={"M": 16, "N": 7168, "K": 2048},
    shapes=tuple({"M": m, "N": n, "K": k} for m in (1, 64) for n, k in DSV3)))


def mm_config(m: int, n: int, k: int, fp8: bool, dtype, device) -> dict:
    """The persistent kernel's config: tuned on CUDA (lookup chain), else the table's."""
    mm = _mm()
    if device.type != "cuda":
        return mm.pick(mm.FP8_CONFIGS if fp8 else mm.MM_CONFIGS, m)
    p = {"M": m, "N": n, "K": k}
    ks, p = (FP8_MM, p) if fp8 else (MM, dict(p, dtype=_fmt(dtype)))
    arch = mm.cdna_arch(device)
    if arch is not None:
        # CDNA: a tuned entry where one applies, else the arch's table (tiles and knobs)
        c = tuning.choice(ks, p, device)
        return c.config if c.link != "heuristic" else mm.pick(mm.tables(fp8, arch), m)
    return tuning.config(ks, p, device)


def stream_config(m: int, n: int, k: int, fp8: bool, dtype, device) -> dict:
    """The streaming kernel's config: tuned on CUDA (lookup chain), else the table's."""
    g = _gemv()
    if device.type != "cuda" or (not fp8 and m > 16):
        return dict(g.STREAM_CONFIGS[("fp8" if fp8 else "16bit", _mpad(m))])
    p = {"M": m, "N": n, "K": k}
    arch = None if fp8 else cdna_arch(device)
    if arch is not None:
        # CDNA: a tuned entry where one applies, else the arch's table (tiles and knobs)
        c = tuning.choice(GEMV, dict(p, dtype=_fmt(dtype)), device)
        return dict(c.config) if c.link != "heuristic" else dict(g.CDNA_STREAM_CONFIGS[arch])
    return tuning.config(FP8_STREAM, p, device) if fp8 else \
        tuning.config(GEMV, dict(p, dtype=_fmt(dtype)), device)


def cdna_arch(device: torch.device) -> str | None:
    """The CDNA arch with its own GEMM tables ("gfx942", "gfx950"), or None."""
    return _mm().cdna_arch(device)
