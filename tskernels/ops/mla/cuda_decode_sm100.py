"""Hand-written CUDA absorbed-MLA decode for Blackwell (`cuda/mla_decode_tcgen05.cu`).

COMPILED, NOT RUN: no Blackwell hardware. CI compiles it for sm_100a and sm_103a (nvcc and
NVRTC) and checks the tcgen05 MMAs / commits, TMEM loads and TMA copies in its SASS
(tests/compile/test_blackwell_sources.py); nothing here was ever executed, so it is
registered compile-verified for sm_100 only and the selector never picks it by itself.

The op and its interface are the Hopper kernel's (`cuda_decode.py`, run-verified on the H200):
kv_lora_rank 512 + rope 64, 16-bit q with a cache of its dtype or fp8-e4m3 latents (per-tensor
scale), pages of 64 / 128 / 256 rows, split-KV partials merged by the attention family's merge
kernel (the same launch as Hopper's). What differs is the work split, forced by tensor memory:
one CTA = 128 heads (the MMA's M, one head per TMEM lane) x half of the 512 output columns, so
that O [128 x 256] fp32 and two [128 x 32] logit tiles fit the 512 TMEM columns; 32-key tiles,
because the [128 x 576] Q block alone takes 144 KB of the 227 KB of shared memory.

Compiled at plan time with NVRTC for sm_100a (sm_103a on a B300), launched with the driver API
on torch's current stream; the cache's TMA descriptors are encoded on the host per `run` (no
device work, no sync: CUDA-graph capturable).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import triton

from .. import cuda_driver
from ...platform import platform_of
from ...plan import PlanBase
from ...registry import Capability, register
from ..shared.split_kv import merge_block_d, merge_kernel
from ._validate import CUDA_TRAITS as TRAITS
from ._validate import DC, DR, LOG2E, MAX_AUTO_SPLITS, MAX_HEADS, PAGE_SIZES

SOURCE = Path(__file__).with_name("cuda") / "mla_decode_tcgen05.cu"
KERNEL = "mla_decode_tcgen05_kernel"
ARCHS = {(10, 0): "sm_100a", (10, 3): "sm_103a"}
HEADS_PER_CTA = 128    # the MMA's M: one head per TMEM lane
COLUMN_HALVES = 2      # output columns per CTA: 512 / 2
BLOCK_N = 32           # cache rows per tile (the logits MMA's N)
STAGES = 2
# the architecture's limits the budgets below are checked against (tests/compile/...)
SM100_SMEM_PER_BLOCK = 232448   # 227 KB of dynamic shared memory per CTA (228 KB per SM)
SM100_TMEM_COLUMNS = 512        # x 128 lanes x 32 bits per SM
SM100_TMEM_LANES = 128


def threads(fp8: bool = False) -> int:
    """Producer warp + MMA warp + 4 softmax warps (+ 4 e4m3 -> f16 converter warps)."""
    return 32 * (6 + (4 if fp8 else 0))


def smem_bytes(fp8: bool = False) -> int:
    """Q block (9 chunks of [128 x 64] 16-bit), the 2-stage tile ring (9 chunks of [32 x 64]
    each; fp8 tiles land in a stage's upper half and are converted in place), P [128 x 32]
    16-bit, 128 bytes of mbarriers and the TMEM address slot, 1 KB for 1024-byte alignment (the
    source's SMEM_BYTES, the same for both builds)."""
    q = 9 * HEADS_PER_CTA * 128
    ring = STAGES * 9 * BLOCK_N * 128
    p = HEADS_PER_CTA * BLOCK_N * 2
    return q + ring + p + 128 + 1024


def tmem_columns() -> tuple[int, int]:
    """(columns used, columns allocated): O [128 x 256] fp32 + two [128 x 32] logit tiles;
    tcgen05.alloc takes a power of two >= 32."""
    used = 512 // COLUMN_HALVES + 2 * BLOCK_N
    alloc = 32
    while alloc < used:
        alloc *= 2
    return used, alloc


def head_blocks(num_heads: int) -> int:
    return -(-num_heads // HEADS_PER_CTA)


def grid_size(batch: int, num_heads: int, num_splits: int) -> int:
    """CTAs of one launch: request x 128-head block x column half x split (the kernel's
    blockIdx decomposition, head block fastest)."""
    return batch * head_blocks(num_heads) * COLUMN_HALVES * num_splits


def split_tiles(seq_len: int, num_splits: int, split: int) -> tuple[int, int]:
    """(first tile, tile count) of split `split` of a request of `seq_len` keys: the kernel's
    schedule (ceil(tiles / num_splits) tiles per split, the last ones possibly short or
    empty; an empty split writes o = 0 and lse = -inf, which the merge ignores)."""
    tiles = -(-seq_len // BLOCK_N)
    per = -(-tiles // num_splits)
    t0 = split * per
    return t0, max(0, min(tiles, t0 + per) - t0)


def default_splits(batch: int, num_heads: int, max_seq_len: int, sms: int) -> int:
    """The Hopper kernel's policy (cuda_decode.default_splits, measured on the H200) with this
    kernel's CTAs: one CTA per SM (the ring and Q take ~225 KB), split each request's tiles so
    that one wave fills the GPU, at least 128 keys (four tiles) per split, at most
    MAX_AUTO_SPLITS; a batch that fills the GPU alone is not split. Unmeasured on Blackwell."""
    ctas = max(1, batch * head_blocks(num_heads) * COLUMN_HALVES)
    tiles = -(-max(max_seq_len, 1) // BLOCK_N)
    return max(1, min(sms // ctas, tiles // 4, MAX_AUTO_SPLITS))


def nvcc_options(fp16: bool, extra: tuple[str, ...] = (), fp8: bool = False) -> tuple[str, ...]:
    """fp16: q (and a 16-bit cache) fp16; fp8: an fp8-e4m3 latent cache (the MMAs in f16)."""
    if fp8:
        return ("-std=c++17", cuda_driver.INCLUDE, "-DFP8KV", *(("-DQF16",) if fp16 else ()),
                *extra)
    return ("-std=c++17", cuda_driver.INCLUDE, *(("-DFP16",) if fp16 else ()), *extra)


class Sm100MLADecodePlan(PlanBase):
    """Per-batch launch plan (reads nothing from the device; `run` neither syncs nor
    allocates given `out`). Arguments as `cuda_decode.CudaMLADecodePlan`."""

    KERNEL = "mla.decode.cuda_tcgen05"
    REPR_FIELDS = ('batch', 'H', 'page_size', 'num_splits', 'fp8')

    def __init__(self, page_table, seq_lens, *, num_heads, kv_lora_rank, rope_dim, page_size,
                 scale, max_seq_len=None, num_splits=None, kv_dtype=None,
                 q_dtype=torch.bfloat16, extra=()):
        who = "CUDA tcgen05 MLA decode"
        if kv_lora_rank != DC or rope_dim != DR:
            raise ValueError(f"{who}: kv_lora_rank {DC} + rope {DR} only, got "
                             f"{kv_lora_rank} + {rope_dim}")
        if not 1 <= num_heads <= MAX_HEADS:
            raise ValueError(f"{who}: num_heads in 1..{MAX_HEADS}, got {num_heads}")
        if page_size not in PAGE_SIZES:
            raise ValueError(f"{who}: page_size 64, 128 or 256, got {page_size}")
        if q_dtype not in (torch.bfloat16, torch.float16) or \
                kv_dtype not in (None, q_dtype, torch.float8_e4m3fn):
            raise ValueError(f"{who}: bf16 or fp16 q with a cache of the same dtype or "
                             f"fp8-e4m3, got q {q_dtype}, cache {kv_dtype}")
        dev = page_table.device
        if dev.type != "cuda":
            raise ValueError(f"{who}: page_table must be on a CUDA device, got {dev}")
        for name, t in (("page_table", page_table), ("seq_lens", seq_lens)):
            if t.dtype != torch.int32 or t.device != dev:
                raise ValueError(f"{who}: {name} must be int32 on {dev}, got {t.dtype} on "
                                 f"{t.device}")
        if page_table.dim() != 2 or page_table.stride(1) != 1 or seq_lens.dim() != 1 or \
                seq_lens.shape[0] != page_table.shape[0] or not seq_lens.is_contiguous():
            raise ValueError(f"{who}: page_table [B, P] with contiguous rows and seq_lens [B], "
                             f"got {tuple(page_table.shape)} and {tuple(seq_lens.shape)}")
        self.fp8 = kv_dtype == torch.float8_e4m3fn
        self.page_table, self.seq_lens, self.device = page_table, seq_lens, dev
        self.H, self.page_size, self.q_dtype, self.scale = num_heads, page_size, q_dtype, scale
        self.batch = B = page_table.shape[0]
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * page_size
        if num_splits is None:
            num_splits = default_splits(B, num_heads, max_seq_len, platform_of(dev).num_sms)
        if not 1 <= num_splits <= 256:
            raise ValueError(f"{who}: num_splits in 1..256, got {num_splits}")
        self.num_splits = num_splits
        if num_splits > 1:
            self.partial_o = torch.empty(B * num_heads * num_splits, DC, dtype=torch.float32,
                                         device=dev)
            self.partial_lse = torch.empty(B * num_heads * num_splits, dtype=torch.float32,
                                           device=dev)
        self._fn = cuda_driver.arch_function(
            dev, SOURCE, KERNEL, nvcc_options(q_dtype == torch.float16, extra, self.fp8),
            smem_bytes(self.fp8), who, ARCHS, "sm_100a / sm_103a (Blackwell B200 / B300)")

    def run(self, q, kv_cache, *, kv_scale=None, out=None):
        """q [B, H, 576] -> o [B, H, 512] (into `out` when given)."""
        who = "CUDA tcgen05 MLA decode"
        if self.fp8 != (kv_scale is not None):
            raise ValueError(f"{who}: kv_scale is required for an fp8 latent cache and only for "
                             f"one (the plan was made for {'fp8' if self.fp8 else '16-bit'})")
        if kv_scale is not None and (kv_scale.dtype != torch.float32 or kv_scale.numel() != 1
                                     or kv_scale.device != q.device):
            raise ValueError(f"{who}: kv_scale must be one float32 value on q's device")
        B, H = self.batch, self.H
        if q.dtype != self.q_dtype or tuple(q.shape) != (B, H, DC + DR) or q.stride(2) != 1 or \
                q.device != self.device or q.data_ptr() % 16 or q.stride(0) % 8 or \
                q.stride(1) % 8:
            raise ValueError(f"{who}: q must be [{B}, {H}, {DC + DR}] {self.q_dtype} on "
                             f"{self.device} with 16-byte-aligned rows, got {tuple(q.shape)} "
                             f"{q.dtype} strides {tuple(q.stride())}")
        want = torch.float8_e4m3fn if self.fp8 else q.dtype
        if kv_cache.dtype != want or kv_cache.dim() != 3 or \
                tuple(kv_cache.shape[1:]) != (self.page_size, DC + DR) or \
                not kv_cache.is_contiguous() or kv_cache.data_ptr() % 16 or \
                kv_cache.device != q.device:
            raise ValueError(f"{who}: kv_cache must be a contiguous [pages, {self.page_size}, "
                             f"{DC + DR}] {want} tensor on {q.device}, got "
                             f"{tuple(kv_cache.shape)} {kv_cache.dtype}")
        o = out if out is not None else q.new_empty(B, H, DC)
        # the epilogue stores 16 bytes (8 outputs) per thread and step
        if o.dtype != q.dtype or tuple(o.shape) != (B, H, DC) or o.stride(2) != 1 or \
                o.device != q.device or o.data_ptr() % 16 or o.stride(0) % 8 or o.stride(1) % 8:
            raise ValueError(f"{who}: out must be [{B}, {H}, {DC}] {q.dtype} with 16-byte-"
                             f"aligned contiguous rows, got {tuple(o.shape)} {o.dtype} strides "
                             f"{tuple(o.stride())}")
        if B == 0:
            return o
        rows = kv_cache.shape[0] * self.page_size
        c = ctypes
        if self.fp8:  # boxes of [rows x 192 bytes], unswizzled (the kernel converts them)
            maps = [cuda_driver.tensor_map_2d(kv_cache, rows, DC + DR, DC + DR, box, 192, False)
                    for box in (BLOCK_N, 1)]
        else:
            maps = [cuda_driver.tensor_map_2d(kv_cache, rows, DC + DR, (DC + DR) * 2, box)
                    for box in (BLOCK_N, 1)]
        S = self.num_splits
        po, plse = (self.partial_o, self.partial_lse) if S > 1 else (o, o)
        ptr = c.c_uint64
        args = (*maps, *(ptr(t.data_ptr()) for t in (q, o, po, plse, self.seq_lens,
                                                     self.page_table)),
                ptr(kv_scale.data_ptr() if self.fp8 else 0), c.c_float(self.scale * LOG2E),
                c.c_int(H), c.c_int(S), c.c_int(self.page_size.bit_length() - 1),
                *(c.c_int64(s) for s in (q.stride(0), q.stride(1), o.stride(0), o.stride(1),
                                         self.page_table.stride(0))),
                ptr(kv_cache.data_ptr() if self.fp8 else 0))
        cuda_driver.launch(self._fn, grid_size(B, H, S), threads(self.fp8),
                           smem_bytes(self.fp8), q.device, args)
        if S > 1:
            bs = max(2, triton.next_power_of_2(S))
            bd = merge_block_d(DC, bs)
            merge_kernel[(H, B, DC // bd)](
                self.partial_o, self.partial_lse, self.seq_lens, o, S, H, o.stride(0),
                o.stride(1), D=DC, BLOCK_D=bd, ROW=DC, BLOCK_S=bs, SINKS=False, num_warps=4)
        return o


register("mla", "decode", backend="cuda_tcgen05", traits=TRAITS,
         capability=Capability(vendors=frozenset({"nvidia"}), min_sm=100, max_sm=103,
                               modules=frozenset({"cuda.bindings"})),
         formats={"q": ("fp16", "bf16"), "kv": ("fp16", "bf16", "fp8_e4m3:per_tensor")},
         band="specialized", tags=("deterministic", "throughput"), compiled=("sm_100",),
         plan=Sm100MLADecodePlan,
         description="CUDA absorbed-MLA paged decode (tcgen05 + TMEM + TMA, sm_100a), 128-head "
                     "blocks; compiled, not run: no Blackwell hardware.")
