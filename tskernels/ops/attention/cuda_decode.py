"""Hand-written CUDA paged decode for fp8-e4m3 KV caches (`cuda/decode_fp8.cu`).

Warp-level e4m3 tensor-core MMAs (mma.sync m16n8k32, sm_89+) read K and V straight from
shared memory, neither converted to 16 bits (the Triton kernel converts V: Triton has no
byte-wise operand transpose). Narrow on purpose: head dim 128, up to 8 query heads per KV
head, per-tensor or per-head scales, no sliding window / softcap / sinks; the registry only
offers it for problems with those traits. Compiled at first use with NVRTC through CuPy (an
optional dependency, present on the GPU image), launched on torch's current stream, so a plan's
`run` is CUDA-graph capturable. Split-KV partials are merged by the Triton decode's merge kernel.

Verification: run on the H200 (sm_90) by the GPU tier (tests/kernels/test_attention_cuda.py);
sm_100 / sm_120 builds are compile-checked only (tests/compile/test_cuda_sources.py).
"""
from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import torch
import triton

from ...platform import platform_of
from .. import cuda_driver
from ...plan import PlanBase
from ...registry import Capability, register
from ..shared.split_kv import choose_splits, merge_kernel, merge_warps

SOURCE = Path(__file__).with_name("cuda") / "decode_fp8.cu"
HEAD_DIM = 128
MAX_GROUP = 8
# Launch configs (warps, stages) from the H200 sweeps (benchmarks/RESULTS.md, CUDA fp8 decode):
# 4 warps x 2 stages (64 KB, 3 CTAs per SM) leads at most shapes; when the grid overflows its
# one wave but fits the 4-CTAs-per-SM wave of 2 warps x 3 stages (48 KB), that one is taken
# (B=64 L=4k: 147.7 vs 164.2 us).
DEFAULT_CONFIG, ONE_WAVE_CONFIG = (4, 2), (2, 3)
_lock = threading.Lock()
_modules: dict[tuple, object] = {}
_streams: dict[int, object] = {}


def smem_bytes(num_warps: int, num_stages: int) -> int:
    """Dynamic shared memory of one CTA: the K/V ring (the warps' combine reuses it)."""
    ring = num_stages * 2 * 32 * num_warps * HEAD_DIM
    combine = num_warps * 8 * (2 + HEAD_DIM) * 4
    return max(ring, combine)


def min_blocks(num_warps: int, num_stages: int) -> int:
    """CTAs per SM the shared memory allows, as many as the registers can follow (the
    register budget is fitted to it: 65536 / (threads * CTAs) >= 168, the kernel's need)."""
    regs_cap = 65536 // (32 * num_warps * 168)
    return max(1, min(regs_cap, (227 << 10) // smem_bytes(num_warps, num_stages)))


def nvcc_options(num_warps: int, num_stages: int) -> tuple[str, ...]:
    return ("-std=c++17", cuda_driver.INCLUDE, f"-DNW={num_warps}", f"-DSTAGES={num_stages}",
            f"-DMINB={min_blocks(num_warps, num_stages)}")


def _function(device: torch.device, num_warps: int, num_stages: int):
    """The compiled kernel for (device, warps, stages), built once with NVRTC via CuPy."""
    key = (device.index, num_warps, num_stages)
    with _lock:
        fn = _modules.get(key)
        if fn is None:
            try:
                import cupy
            except ImportError as e:  # pragma: no cover - GPU images carry CuPy
                raise RuntimeError("the CUDA decode backend needs CuPy (pip install "
                                   "cupy-cuda12x / cupy-cuda13x)") from e
            with cupy.cuda.Device(device.index):
                mod = cupy.RawModule(code=SOURCE.read_text(),
                                     options=nvcc_options(num_warps, num_stages))
                fn = mod.get_function("decode_fp8_kernel")
                fn.max_dynamic_shared_size_bytes = smem_bytes(num_warps, num_stages)
            _modules[key] = fn
    return fn


def _cupy_stream(device: torch.device):
    """CuPy's handle on torch's current stream (cached per stream): launches join torch's
    stream order and its CUDA-graph captures."""
    import cupy
    ptr = torch.cuda.current_stream(device).cuda_stream
    s = _streams.get(ptr)
    if s is None:
        with warnings.catch_warnings():  # CuPy 14 deprecates the name, not the behaviour
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _streams[ptr] = cupy.cuda.ExternalStream(ptr, device.index)
    return s


def _ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


class CudaDecodePlan(PlanBase):
    """Per-batch plan of the CUDA fp8 decode (same contract as the Triton DecodePlan: `run`
    neither synchronises nor allocates given `out`)."""

    KERNEL = "attention.decode.cuda"
    REPR_FIELDS = ('batch', 'hq', 'hkv', 'd', 'page_size', 'num_splits', 'num_warps', 'num_stages', 'pdl')

    def __init__(self, page_table, seq_lens, *, num_q_heads, num_kv_heads, head_dim, page_size,
                 q_dtype, kv_dtype, scale, sliding_window=None, softcap=None, max_seq_len=None,
                 num_splits=None, num_warps=None, num_stages=None):
        if kv_dtype != torch.float8_e4m3fn:
            raise ValueError(f"CUDA decode: fp8-e4m3 caches only, got {kv_dtype}")
        if head_dim != HEAD_DIM:
            raise ValueError(f"CUDA decode: head_dim {HEAD_DIM} only, got {head_dim}")
        if q_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"CUDA decode: q must be bf16 or fp16, got {q_dtype}")
        if sliding_window is not None or softcap is not None:
            raise ValueError("CUDA decode: no sliding window or softcap (use the Triton backend)")
        group = num_q_heads // num_kv_heads
        if not 1 <= group <= MAX_GROUP:
            raise ValueError(f"CUDA decode: 1..{MAX_GROUP} query heads per KV head, got {group}")
        dev = page_table.device
        if dev.type != "cuda":
            raise ValueError("CUDA decode: tensors must be on a CUDA device")
        self.page_table, self.seq_lens = page_table, seq_lens
        self.batch, self.hq, self.hkv, self.d = page_table.shape[0], num_q_heads, num_kv_heads, \
            head_dim
        self.group, self.page_size, self.q_dtype, self.scale = group, page_size, q_dtype, scale
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * page_size
        sms = platform_of(dev).num_sms
        nw, ns = DEFAULT_CONFIG
        self.num_splits = num_splits or choose_splits(self.batch, num_kv_heads, max_seq_len,
                                                      sms, 32 * nw)
        ctas = self.batch * num_kv_heads * self.num_splits
        if sms * min_blocks(nw, ns) < ctas <= sms * min_blocks(*ONE_WAVE_CONFIG):
            nw, ns = ONE_WAVE_CONFIG
        self.num_warps, self.num_stages = num_warps or nw, num_stages or ns
        if self.num_warps not in (2, 4, 8) or self.num_stages < 2:
            raise ValueError(f"CUDA decode: num_warps in (2, 4, 8), num_stages >= 2; got "
                             f"{self.num_warps}, {self.num_stages}")
        num_warps, num_stages = self.num_warps, self.num_stages
        n = self.batch * num_q_heads * self.num_splits
        if self.num_splits > 1:
            self.partial_o = torch.empty(n, head_dim, dtype=torch.float32, device=dev)
            self.partial_lse = torch.empty(n, dtype=torch.float32, device=dev)
        else:
            self.partial_o = self.partial_lse = None
        # the merge as a programmatic dependent launch (sm_90+: the kernel triggers it early)
        self.pdl = torch.cuda.get_device_capability(dev)[0] >= 9
        self._fn = _function(dev, num_warps, num_stages)  # compile now, not inside a capture
        self._smem = smem_bytes(num_warps, num_stages)

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        """q [B, Hq, 128] -> o [B, Hq, 128] (into `out` when given)."""
        check_run_args(self, q, k_cache, v_cache, sinks, k_scale, v_scale, out)
        per_head = k_scale.numel() > 1
        B = self.batch
        o = torch.empty_like(q) if out is None else out
        if B == 0:
            return o
        split = self.num_splits > 1
        po = self.partial_o if split else o
        plse = self.partial_lse if split else self.seq_lens
        args = (_ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(self.page_table),
                _ptr(self.seq_lens), _ptr(k_scale), _ptr(v_scale), _ptr(o), _ptr(po),
                _ptr(plse), np.float32(self.scale), np.int32(self.num_splits),
                np.int32(self.group), np.int32(self.page_size),
                np.int32(self.page_size.bit_length() - 1
                         if self.page_size & (self.page_size - 1) == 0 else -1),
                np.int32(per_head),
                np.int32(q.dtype == torch.bfloat16),
                *(np.int64(s) for s in (q.stride(0), q.stride(1), k_cache.stride(0),
                                        k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
                                        v_cache.stride(1), v_cache.stride(2),
                                        self.page_table.stride(0), o.stride(0), o.stride(1))))
        with _cupy_stream(q.device):
            self._fn((self.num_splits, self.hkv, B), (32 * self.num_warps,), args,
                     shared_mem=self._smem)
        if split:
            bs = max(2, triton.next_power_of_2(self.num_splits))
            merge_kernel[(self.hq, B)](
                self.partial_o, self.partial_lse, self.seq_lens, o, self.num_splits, self.hq,
                o.stride(0), o.stride(1), D=self.d, BLOCK_D=self.d, BLOCK_S=bs, SINKS=False,
                PDL=self.pdl, num_warps=merge_warps(bs, self.d),
                **({"launch_pdl": True} if self.pdl else {}))
        return o


def check_run_args(plan, q, k_cache, v_cache, sinks, k_scale, v_scale, out) -> None:
    """Everything `run` relies on that the kernel cannot check (host-side, no sync): shapes and
    dtypes against the plan, 16-byte aligned cache rows, float32 scales on the device."""
    if sinks is not None:
        raise ValueError("CUDA decode: attention sinks are not supported")
    if k_scale is None or v_scale is None:
        raise ValueError("CUDA decode: k_scale and v_scale are required (fp8 cache)")
    if q.dtype != plan.q_dtype or k_cache.dtype != torch.float8_e4m3fn or \
            v_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"CUDA decode: planned for q {plan.q_dtype} and an fp8 cache, got "
                         f"{q.dtype} / {k_cache.dtype} / {v_cache.dtype}")
    want = (plan.batch, plan.hq, plan.d)
    if tuple(q.shape) != want or q.stride(2) != 1:
        raise ValueError(f"CUDA decode: q must be {want} with a contiguous last dim, got "
                         f"{tuple(q.shape)} strides {tuple(q.stride())}")
    if out is not None and (tuple(out.shape) != want or out.dtype != q.dtype or
                            out.stride(2) != 1 or out.device != q.device):
        raise ValueError(f"CUDA decode: out must be {want} {q.dtype} on {q.device} with a "
                         f"contiguous last dim, got {tuple(out.shape)} {out.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or t.shape[2] != plan.hkv or t.shape[3] != plan.d or \
                t.shape[1] != plan.page_size or t.device != q.device:
            raise ValueError(f"CUDA decode: {name} must be [pages, {plan.page_size}, "
                             f"{plan.hkv}, {plan.d}] on {q.device}, got {tuple(t.shape)}")
        if t.data_ptr() % 16 or any(s % 16 for s in t.stride()[:3]) or t.stride(3) != 1:
            raise ValueError(f"CUDA decode: {name} rows must be 16-byte aligned "
                             f"(strides {tuple(t.stride())})")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t.dtype != torch.float32 or t.device != q.device or t.numel() not in (1, plan.hkv):
            raise ValueError(f"CUDA decode: {name} must be float32 [1] or [{plan.hkv}] on "
                             f"{q.device}, got {t.dtype} {tuple(t.shape)}")
    if k_scale.numel() != v_scale.numel():
        raise ValueError("CUDA decode: k_scale and v_scale must both be per-tensor or per-head")


TRAITS = {"head_dim": lambda d: d == HEAD_DIM, "page_size": lambda p: 1 <= p <= 256,
          "gqa": lambda g: 1 <= g <= MAX_GROUP, "softcap": lambda x: not x,
          "sliding_window": lambda x: not x, "sinks": lambda x: not x}


# Auto-selected from 64 (request, KV head) pairs up: at B=1 (8 pairs) the Triton fp8 kernel is
# ahead (10.1 vs 13.1 us at L=4k; the CTA's fixed costs dominate 128-key splits), at B=16 (128
# pairs) this one (46.2 vs 55.2 us; benchmarks/RESULTS.md, CUDA fp8 decode). The
# threshold between is not measured. Named (backend="cuda"), it runs any batch.
PREFER = {"kv_programs": lambda n: n >= 64}


register("attention", "decode", backend="cuda",
         capability=Capability(vendors=frozenset({"nvidia"}), min_sm=89,
                               modules=frozenset({"cupy"})),
         formats={"q": ("fp16", "bf16"), "kv": ("fp8_e4m3:per_tensor", "fp8_e4m3:per_head")},
         traits=TRAITS, band="specialized", tags=("deterministic", "latency", "throughput"),
         compiled=("sm_90", "sm_100", "sm_120"), prefer=PREFER,
         plan=CudaDecodePlan,
         description="CUDA paged GQA decode over an fp8 cache (e4m3 warp MMAs, K and V unconverted).")
