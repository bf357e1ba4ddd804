"""Hand-written 16-bit GEMM for Blackwell (`cuda/gemm_tcgen05.cu`): c = a @ b.T.

COMPILED, NOT RUN: no Blackwell hardware. CI compiles it for sm_100a / sm_103a (nvcc and
NVRTC) and checks its tcgen05 MMAs, commits, TMEM loads and TMA copies in the SASS
(tests/compile/test_blackwell_sources.py); it is registered compile-verified for sm_100 only
and never selected by itself. The simplest correct tcgen05 GEMM (one [128 x 256] tile per CTA,
4-stage TMA ring, producer / MMA / epilogue warps), the second Blackwell kernel next to the MLA
decode; not tuned (no persistent scheduler, no 2-CTA pairs).

Compiled with NVRTC at first use per (device, dtypes), launched with the driver API on torch's
current stream; the operands' TMA descriptors are encoded on the host per call (no device work,
no sync: CUDA-graph capturable).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import cuda_driver
from ...registry import Capability, register
from ._sm100 import ARCHS, nvcc_options, prepare

SOURCE = Path(__file__).with_name("cuda") / "gemm_tcgen05.cu"
KERNEL = "gemm_tcgen05_kernel"
BLOCK_M, BLOCK_N, BLOCK_K, STAGES = 128, 256, 64, 4
THREADS = 192
TMEM_COLUMNS = BLOCK_N  # the fp32 accumulator [128 x 256]: one row per lane


def smem_bytes() -> int:
    """The ring (a [128 x 64] and b [256 x 64] 16-bit box per stage), 128 bytes of mbarriers and
    the TMEM slot, 1 KB of alignment slack (the source's SMEM_BYTES)."""
    return STAGES * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 + 128 + 1024


def grid(m: int, n: int) -> tuple[int, int]:
    """(tiles along N, tiles along M): the launch grid."""
    return -(-n // BLOCK_N), -(-m // BLOCK_M)


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None
       ) -> torch.Tensor:
    """a [M, K] and b [N, K] of one 16-bit dtype on an sm_100 / sm_103 device -> c [M, N] of
    out_dtype (bf16 or fp16, default a's), fp32 accumulation."""
    who = "CUDA tcgen05 GEMM"
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
    bmap = cuda_driver.tensor_map_2d(b, N, k8, b.stride(0) * 2, BLOCK_N)
    args = (amap, bmap, ctypes.c_uint64(c.data_ptr()), ctypes.c_int(M), ctypes.c_int(N),
            ctypes.c_int(k8), ctypes.c_int64(c.stride(0)))
    gx, gy = grid(M, N)
    _launch_2d(fn, gx, gy, a.device, args)
    return c[:, :N] if c.shape[1] != N else c


def _launch_2d(fn, gx: int, gy: int, device: torch.device, args) -> None:
    """cuLaunchKernel of a (gx, gy) grid on torch's current stream (cuda_driver.launch is 1-D)."""
    cu = cuda_driver.driver()
    ptrs = (ctypes.c_void_p * len(args))(*(ctypes.addressof(x) for x in args))
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        err, = cu.cuLaunchKernel(fn, gx, gy, 1, THREADS, 1, 1, smem_bytes(),
                                 cu.CUstream(stream), ctypes.addressof(ptrs), 0)
    cuda_driver.check(err, "cuLaunchKernel")


register("gemm", "mm", backend="cuda_tcgen05",
         capability=Capability(vendors=frozenset({"nvidia"}), min_sm=100, max_sm=103,
                               modules=frozenset({"cuda.bindings"})),
         formats={"a": ("fp16", "bf16"), "b": ("fp16", "bf16"), "c": ("fp16", "bf16")},
         band="specialized", tags=("deterministic",), compiled=("sm_100",),
         description="CUDA 16-bit GEMM (tcgen05 + TMEM + TMA, sm_100a), [128 x 256] tiles; "
                     "compiled, not run: no Blackwell hardware.")(mm)
