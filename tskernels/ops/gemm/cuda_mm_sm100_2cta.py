"""16-bit GEMM for Blackwell on CTA pairs (`cuda/gemm_tcgen05_2cta.cu`): c = a @ b.T.

COMPILED, NOT RUN: no Blackwell hardware. CI compiles it for sm_100a / sm_103a (nvcc and
NVRTC) and checks its 2-CTA tcgen05 MMAs (UTCHMMA.2CTA), multicast commits (UTCBAR.2CTA),
pair-counted TMA copies (UTMALDG.2D.2CTA) and cluster barriers in the SASS
(tests/compile/test_blackwell_sources.py). Registered compile-verified for sm_100 only and
opt-in: never selected by itself, not even with unverified kernels allowed (the one-CTA
`gemm.mm.cuda_tcgen05` is the unverified candidate there); it runs only when named
(`backend="cuda_tcgen05_2cta"`).

A cluster of two CTAs computes one [256 x 256] tile (cta_group::2, m256n256k16): each CTA
stages its 128 rows of a and half of the tile's b rows, so per CTA a K step of 64 moves 32 KB
into shared memory where the one-CTA [128 x 256] kernel moves 48 KB for the same MMA work.
Launched like the one-CTA kernel (NVRTC cubin, driver API on torch's stream, TMA descriptors
encoded on the host per call: no device work, graph-capturable); the cluster shape is the
kernel's own (__cluster_dims__), so a plain cuLaunchKernel launches pairs.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import cuda_driver
from ...registry import Capability, register
from ._sm100 import ARCHS, nvcc_options, prepare

SOURCE = Path(__file__).with_name("cuda") / "gemm_tcgen05_2cta.cu"
KERNEL = "gemm_tcgen05_2cta_kernel"
CLUSTER = 2                  # CTAs per pair (cta_group::2)
BLOCK_M = 128                # rows of a (and c) per CTA; the pair's tile has 256
BLOCK_N = 256                # columns of c per tile = the MMA's N
B_ROWS = BLOCK_N // CLUSTER  # rows of b each CTA stages
BLOCK_K, STAGES = 64, 7
THREADS = 192
TMEM_COLUMNS = BLOCK_N       # each CTA: its 128 accumulator rows x 256 fp32 columns
SM100_SMEM_PER_BLOCK = 232448  # 227 KB of opt-in dynamic shared memory
SM100_TMEM_COLUMNS = 512


def stage_bytes() -> int:
    """One ring stage of one CTA: its a box [128 x 64] and b box [128 x 64], 16-bit."""
    return (BLOCK_M + B_ROWS) * BLOCK_K * 2


def smem_bytes() -> int:
    """The ring, 128 bytes of mbarriers and the TMEM slot, 1 KB of alignment slack (the
    source's SMEM_BYTES)."""
    return STAGES * stage_bytes() + 128 + 1024


def full_barrier_bytes() -> int:
    """What the even CTA's "full" barrier of a stage expects: both CTAs' boxes."""
    return CLUSTER * stage_bytes()


def grid(m: int, n: int) -> tuple[int, int]:
    """(CTAs along M: two per 256-row tile, tiles along N): the launch grid."""
    return CLUSTER * -(-m // (CLUSTER * BLOCK_M)), -(-n // BLOCK_N)


def cta_tile(bx: int, by: int) -> tuple[int, int, int]:
    """The kernel's blockIdx -> (first row of a / c, first column of c, first row of b) of that
    CTA; its cluster rank is bx % 2 (clusters of (2, 1, 1) are consecutive x indices)."""
    rank = bx % CLUSTER
    m0 = (bx // CLUSTER) * CLUSTER * BLOCK_M + rank * BLOCK_M
    n0 = by * BLOCK_N
    return m0, n0, n0 + rank * B_ROWS


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None
       ) -> torch.Tensor:
    """a [M, K] and b [N, K] of one 16-bit dtype on an sm_100 / sm_103 device -> c [M, N] of
    out_dtype (bf16 or fp16, default a's), fp32 accumulation."""
    who = "CUDA tcgen05 2-CTA GEMM"
    c, a, b, k8, early = prepare(a, b, out_dtype, who)
    if early is not None:
        return early
    M, N, out_dtype = a.shape[0], b.shape[0], c.dtype
    fn = cuda_driver.arch_function(a.device, SOURCE, KERNEL,
                                   nvcc_options(a.dtype == torch.float16,
                                                out_dtype == torch.float16),
                                   smem_bytes(), who, ARCHS,
                                   "sm_100a / sm_103a (Blackwell B200 / B300)")
    amap = cuda_driver.tensor_map_2d(a, M, k8, a.stride(0) * 2, BLOCK_M)
    bmap = cuda_driver.tensor_map_2d(b, N, k8, b.stride(0) * 2, B_ROWS)
    args = (amap, bmap, ctypes.c_uint64(c.data_ptr()), ctypes.c_int(M), ctypes.c_int(N),
            ctypes.c_int(k8), ctypes.c_int64(c.stride(0)))
    gx, gy = grid(M, N)
    cu = cuda_driver.driver()
    ptrs = (ctypes.c_void_p * len(args))(*(ctypes.addressof(x) for x in args))
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        err, = cu.cuLaunchKernel(fn, gx, gy, 1, THREADS, 1, 1, smem_bytes(),
                                 cu.CUstream(stream), ctypes.addressof(ptrs), 0)
    cuda_driver.check(err, "cuLaunchKernel")
    return c[:, :N] if c.shape[1] != N else c


register("gemm", "mm", backend="cuda_tcgen05_2cta",
         capability=Capability(vendors=frozenset({"nvidia"}), min_sm=100, max_sm=103,
                               modules=frozenset({"cuda.bindings"})),
         formats={"a": ("fp16", "bf16"), "b": ("fp16", "bf16"), "c": ("fp16", "bf16")},
         band="specialized", tags=("deterministic",), compiled=("sm_100",), opt_in=True,
         description="CUDA 16-bit GEMM on CTA pairs (tcgen05 cta_group::2 + TMEM + TMA, "
                     "sm_100a), [256 x 256] tiles; opt-in; compiled, not run: no Blackwell "
                     "hardware.")(mm)
