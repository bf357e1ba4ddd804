"""Hand-written CUDA absorbed-MLA decode for Hopper (`cuda/mla_decode_wgmma.cu`).

For 64-128 heads MLA decode is bound by its MMAs, not its bytes: each 1152-byte latent row
costs 2 * 64 * (576 + 512) FLOPs per 64-head block. The Triton kernel holds a [64 x 512] fp32
accumulator in one warpgroup (255 registers, ~230 TFLOP/s on the H200); this kernel splits the
512 output columns between two consumer warpgroups that take the tiles' logits in turn and
exchange P through shared memory, with warpgroup MMAs (wgmma) fed by TMA. With 16 heads (a
padded 64-row block) it is bound by the latent reads and streams them faster than the Triton
kernel's 16-row form too (3.5-4.1 vs 2.7-3.3 TB/s at B >= 64). Narrow on purpose:
sm_90a only, kv_lora_rank 512 + rope 64, 16-bit q and a cache of its dtype or fp8-e4m3 latents
(converted to f16 in shared memory: a memory saving, 0.77-0.89x the bf16 speed, still 1.2-2.7x
the Triton fp8 kernel), 64-head blocks (a last, partial block runs on zero rows), pages of
64 / 128 / 256 rows, a contiguous cache. The
registry offers it only for such problems, and picks it by itself where it was measured faster
(`PREFER`); everything else stays on the Triton kernel.

Compiled at plan time with NVRTC for sm_90a (cuda-python), launched with the driver API on
torch's current stream; the cache's TMA descriptors are encoded on the host per `run` (no
device work, no sync: CUDA-graph capturable). Split-KV partials are merged by the attention
family's Triton merge kernel.
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
from ._validate import (CUDA_TRAITS, DC, DR, LOG2E, MAX_AUTO_SPLITS, MAX_HEADS,  # noqa: F401
                        PAGE_SIZES)

SOURCE = Path(__file__).with_name("cuda") / "mla_decode_wgmma.cu"
KERNEL = "mla_decode_wgmma_kernel"
THREADS = 384          # producer + two consumer warpgroups
HEADS_PER_CTA = 64
BLOCK_N = 64           # cache rows per tile


def smem_bytes(fp8: bool = False) -> int:
    """Q block and a 2-stage tile ring (9 chunks of [64 x 64] 16-bit each), the P buffer, the
    softmax exchange (3 x 64 floats), 4 mbarriers (6 in the fp8 build), 1 KB for 1024-byte
    alignment (the source's SMEM_BYTES)."""
    chunk = 64 * 128
    return 3 * 9 * chunk + chunk + 3 * 64 * 4 + (48 if fp8 else 32) + 1024


def nvcc_options(fp16: bool, extra: tuple[str, ...] = (), fp8: bool = False) -> tuple[str, ...]:
    """fp16: q (and a 16-bit cache) fp16; fp8: an fp8-e4m3 latent cache (the MMAs in f16)."""
    if fp8:
        return ("-std=c++17", cuda_driver.INCLUDE, "-DFP8KV", *(("-DQF16",) if fp16 else ()),
                *extra)
    return ("-std=c++17", cuda_driver.INCLUDE, *(("-DFP16",) if fp16 else ()), *extra)


def default_splits(batch: int, num_heads: int, max_seq_len: int, sms: int) -> int:
    """One CTA per SM (the ring takes ~225 KB of shared memory): split each request's tiles so
    that batch x head blocks x splits fills one wave, at least two tiles per split, at most
    MAX_AUTO_SPLITS; a batch that fills the GPU alone is not split. (H200, benchmarks/RESULTS.md,
    "mla.decode": 16 heads B=1 L=32k 17.9 us at 128 splits vs
    24.9 at 64; a second wave costs more than it spreads, e.g. 128 heads B=1 L=32k 35.0 us at
    64 splits = 128 CTAs vs 48.8 at 96.)"""
    ctas = max(1, batch * -(-num_heads // HEADS_PER_CTA))
    tiles = -(-max(max_seq_len, 1) // BLOCK_N)
    return max(1, min(sms // ctas, tiles // 2, MAX_AUTO_SPLITS))


class CudaMLADecodePlan(PlanBase):
    """Per-batch launch plan (reads nothing from the device; `run` neither syncs nor
    allocates given `out`)."""

    KERNEL = "mla.decode.cuda"
    REPR_FIELDS = ('batch', 'H', 'page_size', 'num_splits', 'fp8')

    def __init__(self, page_table, seq_lens, *, num_heads, kv_lora_rank, rope_dim, page_size,
                 scale, max_seq_len=None, num_splits=None, kv_dtype=None,
                 q_dtype=torch.bfloat16, extra=()):
        """kv_dtype torch.float8_e4m3fn: an fp8 latent cache with a per-tensor scale (the
        -DFP8KV build: the producer warpgroup converts each tile to f16 in shared memory, the
        MMAs run in f16; q is rounded to f16)."""
        if kv_lora_rank != DC or rope_dim != DR:
            raise ValueError(f"CUDA MLA decode: kv_lora_rank {DC} + rope {DR} only, got "
                             f"{kv_lora_rank} + {rope_dim}")
        if not 1 <= num_heads <= MAX_HEADS:
            raise ValueError(f"CUDA MLA decode: 1..{MAX_HEADS} heads, got {num_heads}")
        if page_size not in PAGE_SIZES:
            raise ValueError(f"CUDA MLA decode: page size 64, 128 or 256, got {page_size}")
        if q_dtype not in (torch.bfloat16, torch.float16) or \
                kv_dtype not in (None, q_dtype, torch.float8_e4m3fn):
            raise ValueError(f"CUDA MLA decode: bf16 or fp16 q with a cache of the same dtype "
                             f"or fp8-e4m3, got q {q_dtype}, cache {kv_dtype}")
        self.fp8 = kv_dtype == torch.float8_e4m3fn
        dev = page_table.device
        if dev.type != "cuda":
            raise ValueError("CUDA MLA decode: tensors must be on a CUDA device")
        for name, t in (("page_table", page_table), ("seq_lens", seq_lens)):
            if t.dtype != torch.int32 or t.device != dev:
                raise ValueError(f"CUDA MLA decode: {name} must be int32 on {dev}")
        if page_table.dim() != 2 or page_table.stride(1) != 1 or seq_lens.dim() != 1 or \
                seq_lens.shape[0] != page_table.shape[0] or not seq_lens.is_contiguous():
            raise ValueError("CUDA MLA decode: page_table [B, P] with contiguous rows and "
                             "seq_lens [B]")
        self.page_table, self.seq_lens, self.device = page_table, seq_lens, dev
        self.H, self.page_size, self.q_dtype = num_heads, page_size, q_dtype
        self.scale = scale
        self.batch = B = page_table.shape[0]
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * page_size
        if num_splits is None:
            num_splits = default_splits(B, num_heads, max_seq_len, platform_of(dev).num_sms)
        if not 1 <= num_splits <= 256:
            raise ValueError(f"CUDA MLA decode: num_splits in 1..256, got {num_splits}")
        self.num_splits = num_splits
        if num_splits > 1:
            self.partial_o = torch.empty(B * num_heads * num_splits, DC, dtype=torch.float32,
                                         device=dev)
            self.partial_lse = torch.empty(B * num_heads * num_splits, dtype=torch.float32,
                                           device=dev)
        self._fn = cuda_driver.sm90a_function(dev, SOURCE, KERNEL,
                                              nvcc_options(q_dtype == torch.float16, extra,
                                                           self.fp8),
                                              smem_bytes(self.fp8), "CUDA MLA decode")

    def run(self, q, kv_cache, *, kv_scale=None, out=None):
        """q [B, H, 576] -> o [B, H, 512] (into `out` when given)."""
        if self.fp8 != (kv_scale is not None):
            raise ValueError("CUDA MLA decode: kv_scale is required for an fp8 latent cache "
                             "and only for one (the plan was made for "
                             f"{'fp8' if self.fp8 else 'a 16-bit cache'})")
        if kv_scale is not None and (kv_scale.dtype != torch.float32 or kv_scale.numel() != 1
                                     or kv_scale.device != q.device):
            raise ValueError("CUDA MLA decode: kv_scale must be one float32 value on q's device")
        B, H = self.batch, self.H
        if q.dtype != self.q_dtype or tuple(q.shape) != (B, H, DC + DR) or q.stride(2) != 1 or \
                q.device != self.device or q.data_ptr() % 16 or q.stride(0) % 8 or \
                q.stride(1) % 8:
            raise ValueError(f"CUDA MLA decode: q must be [{B}, {H}, {DC + DR}] {self.q_dtype} "
                             f"on {self.device} with 16-byte-aligned rows, got "
                             f"{tuple(q.shape)} {q.dtype} strides {tuple(q.stride())}")
        want = torch.float8_e4m3fn if self.fp8 else q.dtype
        if kv_cache.dtype != want or kv_cache.dim() != 3 or \
                tuple(kv_cache.shape[1:]) != (self.page_size, DC + DR) or \
                not kv_cache.is_contiguous() or kv_cache.data_ptr() % 16 or \
                kv_cache.device != q.device:
            raise ValueError(f"CUDA MLA decode: kv_cache must be a contiguous [pages, "
                             f"{self.page_size}, {DC + DR}] {want} tensor on {q.device}, got "
                             f"{tuple(kv_cache.shape)} {kv_cache.dtype}")
        o = out if out is not None else q.new_empty(B, H, DC)
        if o.dtype != q.dtype or tuple(o.shape) != (B, H, DC) or o.stride(2) != 1 or \
                o.device != q.device or o.data_ptr() % 4 or o.stride(0) % 2 or o.stride(1) % 2:
            raise ValueError(f"CUDA MLA decode: out must be [{B}, {H}, {DC}] {q.dtype} with a "
                             f"contiguous last dim, got {tuple(o.shape)} {o.dtype} strides "
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
        # (the fp8 build takes kv_scale's address after the page table and the cache's last)
        fp8_scale = (c.c_uint64(kv_scale.data_ptr()),) if self.fp8 else ()
        args = (*maps, *(c.c_uint64(t.data_ptr()) for t in (q, o, po, plse, self.seq_lens,
                                                             self.page_table)),
                *fp8_scale, c.c_float(self.scale * LOG2E), c.c_int(H), c.c_int(S),
                c.c_int(self.page_size.bit_length() - 1),
                *(c.c_int64(s) for s in (q.stride(0), q.stride(1), o.stride(0), o.stride(1),
                                         self.page_table.stride(0))),
                *((c.c_uint64(kv_cache.data_ptr()),) if self.fp8 else ()))
        cuda_driver.launch(self._fn, B * -(-H // HEADS_PER_CTA) * S, THREADS,
                           smem_bytes(self.fp8),
                           q.device, args)
        if S > 1:
            bs = max(2, triton.next_power_of_2(S))
            bd = merge_block_d(DC, bs)
            merge_kernel[(H, B, DC // bd)](
                self.partial_o, self.partial_lse, self.seq_lens, o, S, H, o.stride(0),
                o.stride(1), D=DC, BLOCK_D=bd, ROW=DC, BLOCK_S=bs, SINKS=False, num_warps=4)
        return o


TRAITS = CUDA_TRAITS
# auto-selected where it was measured faster than the Triton kernel (H200, benchmarks/RESULTS.md,
# "mla.decode": 16, 32, 64 and 128 heads at every shape, B 1-128, L 4k-32k; fp8 latents: 16 and
# 128 heads, B 1-128; fewer heads are not measured); named, it runs any head count
PREFER = {"num_heads": lambda h: h >= 16}


register("mla", "decode", backend="cuda", traits=TRAITS,
         capability=Capability(vendors=frozenset({"nvidia"}), min_sm=90, max_sm=90,
                               modules=frozenset({"cuda.bindings"})),
         formats={"q": ("fp16", "bf16"), "kv": ("fp16", "bf16", "fp8_e4m3:per_tensor")},
         band="specialized",
         tags=("deterministic", "throughput"), compiled=("sm_90",), prefer=PREFER,
         plan=CudaMLADecodePlan,
         description="CUDA absorbed-MLA paged decode (wgmma + TMA, sm_90a), 64-head blocks.")
