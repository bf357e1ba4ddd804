"""Persistent tiled GEMM c = a @ b.T (b in the nn.Linear layout [N, K]): bf16/fp16, and the
block-scaled fp8 form of `fp8_block_mm` for prefill-sized M.

One program per SM walks the output tiles in a grouped order (GROUP_M tile rows share each
weight column panel while it is in L2). On Hopper and Blackwell the operand tiles come through
device-side tensor descriptors (TMA bulk copies into shared memory, no address arithmetic in
the loop); elsewhere (AMD, sm_80, the interpreter's pointer mode) through masked pointer loads.
Both operands are K-major, the layout wgmma / tcgen05 / MFMA read without a transpose.

fp8: a [M, K] e4m3 with per-token-group scales a_s [M, K/128], b [N, K] e4m3 with 128 x 128
block scales b_s [N/128, K/128]. BK = 128 = one scale group, BN = 128 = one weight block, so
each K step is acc += dot(a_tile, b_tile.T) * a_s[:, kb, None] * b_s[nb, kb].
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autotune import backend_options

from ...compile import CompileCase
from . import _tune

# Tile configs per shape bucket (H200; first matching row wins). Kept as data so the
# autotuner (autotune/) can adopt them as its defaults and search around them.
MM_CONFIGS = (
    # (max M, config)
    (128, dict(BM=64, BN=128, BK=64, GROUP_M=8, num_stages=4, num_warps=4)),
    (None, dict(BM=128, BN=256, BK=64, GROUP_M=8, num_stages=3, num_warps=8)),
)
# fp8: two one-warpgroup 64 x 128 CTAs per SM (90 KB of shared memory each), so one CTA's
# MMAs overlap the other's per-K-step scale promotion; H200 at M = 4096 on the DeepSeek-V3
# shapes 1.00-1.15x the 128 x 128, 8-warp, one-CTA config (benchmarks/gemm_decode_ab.py)
FP8_CONFIGS = (
    (None, dict(BM=64, BN=128, BK=128, GROUP_M=8, num_stages=3, num_warps=4, CTAS_PER_SM=2)),
)

# AMD CDNA (wave 64) tables per arch, with the AMD launch knobs (declared per arch in the
# tuning spaces, _tune.py): heuristic, not run (no AMD GPU); the compile matrix shows MFMA, no
# scratch and LDS within the arch for each. AMD's pipeliner keeps num_stages - 1 tiles in LDS:
# the H200 rows above would need 72-144 KB there.
CDNA_MM_CONFIGS = {
    "gfx942": (
        # 64 x 128 over 4 waves (24 KB LDS); waves_per_eu=2 caps VGPRs for two waves per SIMD
        # to hide the weight loads of small M (141 VGPRs)
        (128, dict(BM=64, BN=128, BK=64, GROUP_M=8, num_stages=2, num_warps=4, waves_per_eu=2,
                   matrix_instr_nonkdim=16)),
        # 128 x 256 in one 48 KB LDS buffer of the 64 KB (256 x 256 spilled 200 B); 16x16
        # MFMA as AMD's MI300 GEMM tunings; kpack=2: two K packs per LDS read (188 VGPRs)
        (None, dict(BM=128, BN=256, BK=64, GROUP_M=8, num_stages=2, num_warps=8,
                    matrix_instr_nonkdim=16, kpack=2)),
    ),
    "gfx950": (
        # 160 KB LDS: a second buffer in flight (16 KB each); kpack is gone on gfx950
        (128, dict(BM=64, BN=128, BK=64, GROUP_M=8, num_stages=3, num_warps=4, waves_per_eu=2,
                   matrix_instr_nonkdim=16)),
        # 128 x 256, two 48 KB buffers (96 KB of 160 KB, 180 VGPRs)
        (None, dict(BM=128, BN=256, BK=64, GROUP_M=8, num_stages=3, num_warps=8,
                    matrix_instr_nonkdim=16)),
    ),
}
CDNA_FP8_CONFIGS = {
    # 128 x 128 x 128 fp8 converted to f16 MFMA (gfx942 has fnuz fp8 only): one 32 KB buffer
    # (two spilled 20 B at 64 KB), 246 VGPRs
    "gfx942": ((None, dict(BM=128, BN=128, BK=128, GROUP_M=8, num_stages=2, num_warps=8,
                           matrix_instr_nonkdim=16)),),
    # native e4m3 MFMA (v_mfma_f32_16x16x128_f8f6f4): two 32 KB buffers, 149 VGPRs
    "gfx950": ((None, dict(BM=128, BN=128, BK=128, GROUP_M=8, num_stages=3, num_warps=8,
                           matrix_instr_nonkdim=16)),),
}
_arch: dict[torch.device, str | None] = {}


def cdna_arch(device: torch.device) -> str | None:
    """The CDNA arch with tables above ("gfx942", "gfx950"), or None (NVIDIA, CPU, others)."""
    if device.type != "cuda" or torch.version.hip is None:
        return None
    if device not in _arch:
        from ...platform import platform_of
        arch = platform_of(device).arch
        _arch[device] = arch if arch in CDNA_MM_CONFIGS else None
    return _arch[device]


def tables(fp8: bool, arch: str | None = None):
    """The config table of the bf16 / fp8 kernel on `arch` (None: the NVIDIA one)."""
    if arch is not None:
        return (CDNA_FP8_CONFIGS if fp8 else CDNA_MM_CONFIGS)[arch]
    return FP8_CONFIGS if fp8 else MM_CONFIGS

_sms: dict[torch.device, int] = {}
_allocator_set = False


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 3
    n = _sms.get(device)
    if n is None:
        n = _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _ensure_allocator() -> None:
    """Device-side tensor descriptors need a global scratch buffer from Triton's allocator; give
    it torch's caching allocator (graph-capture safe) unless someone already set one."""
    global _allocator_set
    if _allocator_set:
        return
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream:
                             torch.empty(size, dtype=torch.int8, device="cuda"))
    _allocator_set = True


def pick(table, m: int) -> dict:
    for max_m, cfg in table:
        if max_m is None or m <= max_m:
            return dict(cfg)
    raise AssertionError("config table needs a catch-all row")


# the bf16 table's 128 x 256 tile (M > 128) only where it still makes this many tiles; fewer
# leave most SMs idle, and the 64 x 128 row is taken instead. H200, K = 4096
# (benchmarks/results/h200/s23_lookup_ab.json): M = 256, N = 4096 (32 big tiles) 44.0 us
# against 25.4 with 64 x 128; M = 512, N = 4096 (64) 44.5 vs 45.2; M = 512, N = 8192 (128)
# 49.2 vs 85.3.
BIG_TILE_MIN_TILES = 64


def mm_heuristic(m: int, n: int) -> dict:
    """The bf16 / fp16 persistent kernel's own config for an M x N output (NVIDIA table)."""
    cfg = pick(MM_CONFIGS, m)
    small = MM_CONFIGS[0][1]
    if cfg != small and triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"]) < \
            BIG_TILE_MIN_TILES:
        return dict(small)
    return cfg


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M tile rows advance together along N."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, stride_a, stride_b, stride_c,
               stride_as, stride_bs, NUM_SMS,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               TMA: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr):
    """c [M, N] = a [M, K] @ b [N, K].T, persistent over output tiles (fp8: block-scaled)."""
    start = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1],
                                           block_shape=[BM, BK])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BN, BK])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1],
                                           block_shape=[BM, BN])
    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            if TMA:
                a = a_desc.load([pid_m * BM, ki * BK])
                b = b_desc.load([pid_n * BN, ki * BK])
            else:
                offs_k = ki * BK + tl.arange(0, BK)
                a = tl.load(a_ptr + offs_m.to(tl.int64)[:, None] * stride_a + offs_k[None, :],
                            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
                b = tl.load(b_ptr + offs_n.to(tl.int64)[:, None] * stride_b + offs_k[None, :],
                            mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
            if FP8:
                kb = (ki * BK) // BLOCK
                a_s = tl.load(as_ptr + offs_m * stride_as + kb, mask=offs_m < M, other=0.0)
                b_s = tl.load(bs_ptr + ((pid_n * BN) // BLOCK) * stride_bs + kb)
                acc += tl.dot(a, b.T) * (a_s * b_s)[:, None]
            else:
                acc = tl.dot(a, b.T, acc)
        c = acc.to(c_ptr.dtype.element_ty)
        if TMA:
            c_desc.store([pid_m * BM, pid_n * BN], c)
        else:
            tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * stride_c + offs_n[None, :], c,
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Hopper/Blackwell, 16-byte aligned bases and row strides (what a TMA descriptor needs)."""
    t0 = tensors[0]
    if t0.device.type != "cuda" or torch.cuda.get_device_capability(t0.device)[0] < 9:
        return False
    if torch.version.hip is not None:
        return False
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in tensors)


def persistent_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *,
                  a_scale: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
                  block: int = 128, config: dict | None = None,
                  tma: bool | None = None) -> torch.Tensor:
    """out [M, N] = a [M, K] @ b [N, K].T (block-scaled fp8 when scales are given). All with
    unit stride in their last dim. tma: force descriptor loads on / off (None: where they
    work)."""
    m, k = a.shape
    n = b.shape[0]
    fp8 = a_scale is not None
    cfg = dict(config or _tune.mm_config(m, n, k, fp8, a.dtype, a.device))
    if fp8 and (cfg["BK"] != block or block % cfg["BN"]):
        raise ValueError(f"block: the fp8 kernel needs block == BK ({cfg['BK']}) and a multiple "
                         f"of BN ({cfg['BN']}), got {block}")
    use_tma = _tma_ok(a, b, out) if tma is None else tma
    if use_tma and a.device.type == "cuda":
        _ensure_allocator()
    tiles = triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"])
    # programs resident per SM (2: two one-warpgroup CTAs whose MMA and fp8 scale promotion
    # interleave on the SM, where one CTA would wait for each K step's product)
    sms = _num_sms(a.device) * cfg.get("CTAS_PER_SM", 1)
    dummy = out
    a_s = a_scale if fp8 else dummy
    b_s = b_scale if fp8 else dummy
    _mm_kernel[(max(1, min(sms, tiles)),)](
        a, b, out, a_s, b_s, m, n, k, a.stride(0), b.stride(0), out.stride(0),
        a_s.stride(0) if fp8 else 0, b_s.stride(0) if fp8 else 0, sms,
        BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], GROUP_M=cfg["GROUP_M"], TMA=use_tma,
        FP8=fp8, BLOCK=block, num_stages=cfg["num_stages"], num_warps=cfg["num_warps"],
        **backend_options(cfg))
    return out


_TMA_TARGETS = ("sm_90", "sm_100")
_PTR_TARGETS = ("sm_120",)


def compile_cases(fp8: bool) -> list[CompileCase]:
    """The persistent kernel with descriptor loads (sm_90, sm_100) and pointer loads (the
    others), large-M config."""
    t = "*fp8e4nv" if fp8 else "*bf16"
    sig = {"a_ptr": t, "b_ptr": t, "c_ptr": "*bf16", "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_a": "i32", "stride_b": "i32",
           "stride_c": "i32", "stride_as": "i32", "stride_bs": "i32", "NUM_SMS": "i32"}
    aligned = ("N", "K", "stride_a", "stride_b", "stride_c")
    cfg = pick(FP8_CONFIGS if fp8 else MM_CONFIGS, 1 << 20)
    cases = []
    for tma, targets in ((True, _TMA_TARGETS), (False, _PTR_TARGETS)):
        const = dict(BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], GROUP_M=cfg["GROUP_M"],
                     TMA=tma, FP8=fp8, BLOCK=128)
        cases.append(CompileCase(_mm_kernel, sig, const, num_warps=cfg["num_warps"],
                                 num_stages=cfg["num_stages"] if tma else 2, uses_dot=True,
                                 aligned=aligned, targets=targets,
                                 label=f"{'fp8' if fp8 else 'bf16'} {'tma' if tma else 'ptr'}"))
    # CDNA: every row of the arch's table (pointer loads), with its AMD knobs
    for arch in CDNA_MM_CONFIGS:
        for max_m, cfg in tables(fp8, arch):
            const = dict(BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], GROUP_M=cfg["GROUP_M"],
                         TMA=False, FP8=fp8, BLOCK=128)
            rows = f" M<={max_m}" if max_m else ""
            cases.append(CompileCase(
                _mm_kernel, sig, const, num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"], uses_dot=True, aligned=aligned, targets=(arch,),
                options=tuple(backend_options(cfg).items()),
                label=f"{'fp8' if fp8 else 'bf16'} {arch}{rows}"))
    return cases


# ---- registration ----------------------------------------------------------------------------
def _mm(a, b, *, out_dtype=None):
    """Triton persistent GEMM (TMA descriptor loads on sm_90+, grouped tile order); rows
    M <= 16 go to the weight-streaming kernel."""
    from . import triton_gemv

    m, n = a.shape[0], b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:
        return out.zero_()
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    if m <= 16:
        return triton_gemv.stream_mm(a, b, out)
    return persistent_mm(a, b, out)


def _register() -> None:
    from ...registry import register
    from .._common import TRITON

    fmts = {"a": ("fp16", "bf16"), "b": ("fp16", "bf16"), "c": ("fp16", "bf16")}
    register("gemm", "mm", **{**TRITON, "band": "performant"}, formats=fmts,
             compile_cases=lambda: compile_cases(False))(_mm)


_register()
