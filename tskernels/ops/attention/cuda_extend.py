"""Hand-written CUDA causal prefill for Hopper (`cuda/prefill_wgmma.cu`): warpgroup MMAs.

What it adds over the Triton extend kernel: a producer warpgroup and two consumer warpgroups
that take turns on the tensor cores, so one consumer's softmax overlaps the other's MMAs
(Triton 3.6 serialises the two within a warpgroup on sm_90). Narrow on purpose: sm_90a only
(wgmma), head dim 128, 16-bit q / K / V of one dtype, causal, no sliding window / softcap /
sinks, and no cached prefix (every request's tokens are all new: prefill, or the first chunk
of one); K / V are read from the new tokens' own contiguous [T, Hkv, 128] tensors, which the
caller passes to `run` (the serving runner does). The registry only offers it for problems
with those traits.

Compiled at first use with NVRTC for sm_90a (cuda-python's bindings; CuPy's compile picks the
portable sm_90 target, which has no wgmma), loaded and launched with the driver API on torch's
current stream (the K/V TMA descriptors are 128-byte kernel parameters, encoded per `run` on
the host: no device work, no sync).

Split-KV (paged plans, `splits`): work items (request, query block, key split) write fp32
partial rows + LSE to a workspace allocated with the plan, merged into `out` by
ops/shared/split_kv.py's merge kernel (the split count and tile ranges: ops/shared/
extend_split.py). GQA packing (paged plans, `gqa_pack`, -DPACK): a block's rows are (token,
head-in-group) pairs of one KV head, so short extends fill the 128-row tile and each K/V tile is
read once per group. Both on by default for paged plans since their H200 run (GPU tests and
timings in benchmarks/RESULTS.md, "Session 15": the later turn's 50.8k + 800 layer 1691 ->
1513 us, a 16-token follow-up over 51k 882 -> 67 us); splits=1, gqa_pack=False is the launch
before them (same cubin).

Verification: the GPU tier runs it on the H200 (tests/kernels/test_attention_cuda_extend.py);
tests/compile/test_cuda_sources.py builds it with nvcc and checks the wgmma in its code.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

from ...plan import PlanBase
from ...platform import platform_of
from ...registry import Capability, register
from .. import cuda_driver
from . import _validate as _v
from ..shared import extend_split as split_kv

SOURCE = Path(__file__).with_name("cuda") / "prefill_wgmma.cu"
HEAD_DIM = 128
BLOCK_M = 128          # query rows per CTA (BM in the source)
THREADS = 384          # producer + two consumer warpgroups
BLOCK_N = 128          # keys per tile
STAGES = 3             # K/V ring depth (226 KB of shared memory at BLOCK_N = 128; H200,
                       # 4k / 16k prefill: 252.5 / 3843 us vs 285.2 / 4462 with 2 stages;
                       # benchmarks/RESULTS.md, "attention.extend")
LOG2E = 1.4426950408889634
# The paged plan's key splits when the caller names none: 1 = one CTA per (query block, head)
# walking all its keys (the launch before split-KV); None = chosen per plan from the lengths
# (ops/shared/extend_split.py, choose_splits).
DEFAULT_SPLITS: int | None = None
# GQA packing in the paged plan when the caller names none (False: one query head per CTA, the
# launch before packing).
DEFAULT_GQA_PACK = True


def smem_bytes(stages: int = STAGES, block_n: int = BLOCK_N) -> int:
    """Dynamic shared memory: Q tile, K/V ring, mbarriers, 1 KB for 1024-byte alignment."""
    q = BLOCK_M * HEAD_DIM * 2
    return q + stages * 2 * block_n * HEAD_DIM * 2 + 16 * stages + 1024


def nvcc_options(fp16: bool, stages: int = STAGES, block_n: int = BLOCK_N,
                 extra: tuple[str, ...] = (), paged: bool = False) -> tuple[str, ...]:
    return ("-std=c++17", cuda_driver.INCLUDE, f"-DSTAGES={stages}", f"-DBN={block_n}",
            *(("-DFP16",) if fp16 else ()), *(("-DPAGED",) if paged else ()), *extra)


def _function(device: torch.device, fp16: bool, stages: int = STAGES, block_n: int = BLOCK_N,
              extra: tuple[str, ...] = (), paged: bool = False):
    """The compiled kernel (a CUfunction) for (device, dtype, stages, tile), built once:
    NVRTC -> cubin -> driver module in the device's primary context (torch's).
    extra: more -D options (experiments in benchmarks/attention_gpu.py)."""
    return cuda_driver.sm90a_function(device, SOURCE, "prefill_wgmma_kernel",
                                      nvcc_options(fp16, stages, block_n, extra, paged),
                                      smem_bytes(stages, block_n), "CUDA extend")


def tensor_map(t: torch.Tensor, box_rows: int) -> ctypes.Array:
    """The TMA descriptor of t [rows, heads, 128] (or a paged cache [pages, page_size, heads,
    128], rows = pages * page_size) seen as a 2-D [rows, heads * 128] tensor: boxes of 64
    columns x box_rows rows, 128-byte swizzle, rows past the end read as zeros."""
    if t.dim() == 4:
        t = t.view(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])
    return cuda_driver.tensor_map_2d(t, t.shape[0], t.shape[1] * t.shape[2],
                                     t.stride(0) * t.element_size(), box_rows)


def _launch(fn, grid: int, smem: int, device: torch.device, args) -> None:
    cuda_driver.launch(fn, grid, THREADS, smem, device, args)


def work_table(counts, block_m: int = BLOCK_M, prefixes=None) -> np.ndarray:
    """int32 [blocks, 2]: (request, query block) pairs, the blocks that see the most keys first
    (the last blocks of long requests; with cached prefixes, `prefixes[b]` keys more); ties in
    request, block order."""
    n = np.asarray(counts, dtype=np.int64).reshape(-1)
    pre = np.zeros_like(n) if prefixes is None else np.asarray(prefixes, dtype=np.int64)
    per = -(-n // block_m)
    b = np.repeat(np.arange(len(n)), per)
    i = np.arange(len(b)) - np.repeat(np.cumsum(per) - per, per)
    keys = pre[b] + np.minimum((i + 1) * block_m, n[b])
    order = np.argsort(-keys, kind="stable")
    return np.stack((b[order], i[order]), axis=1).astype(np.int32)


def work_list(counts, block_m: int = BLOCK_M, prefixes=None) -> list[tuple[int, int]]:
    """work_table's pairs as tuples."""
    return [tuple(w) for w in work_table(counts, block_m, prefixes).tolist()]


class CudaExtendPlan(PlanBase):
    """Per-batch plan (same contract as the Triton ExtendPlan: reads qo_indptr / seq_lens on the
    host here, `run` neither synchronises nor allocates given `out`)."""

    KERNEL = "attention.extend.cuda"
    REPR_FIELDS = ('paged', 'hq', 'hkv', 'num_blocks', 'block_n', 'splits', 'gqa_pack')

    def __init__(self, qo_indptr, page_table, seq_lens, *, num_q_heads, num_kv_heads,
                 head_dim, page_size, q_dtype, kv_dtype, scale, causal=True,
                 sliding_window=None, softcap=None, stages=STAGES, block_n=BLOCK_N, extra=(),
                 paged=False, splits="default", gqa_pack="default", host_qo_indptr=None,
                 host_seq_lens=None):
        """host_qo_indptr, host_seq_lens: host copies of qo_indptr / seq_lens (sequences of
        ints; `attention.extend_plan` passes them), read instead of the device tensors.
        paged: read K/V from the paged cache (any cached prefix; page sizes 8-256, powers
        of two) instead of from the new tokens' own k / v (no prefix).
        splits (paged only): key splits per query block (split-KV, ops/shared/extend_split.py):
        1 = the unsplit launch, an int up to 64 = that many (fewer for blocks with fewer
        tiles), None = chosen from the lengths; "default" = DEFAULT_SPLITS when paged, else
        1. The plan's `splits` is the count it launches with.
        gqa_pack (paged only): GQA packing, a block's rows are (token, head-in-group) pairs of
        one KV head (-DPACK); "default" = DEFAULT_GQA_PACK when paged, else False."""
        if head_dim != HEAD_DIM:
            raise ValueError(f"CUDA extend: head_dim {HEAD_DIM} only, got {head_dim}")
        if q_dtype not in (torch.bfloat16, torch.float16) or kv_dtype != q_dtype:
            raise ValueError(f"CUDA extend: bf16 or fp16 q with a cache of the same dtype, got "
                             f"q {q_dtype}, cache {kv_dtype}")
        if not causal or sliding_window is not None or softcap is not None:
            raise ValueError("CUDA extend: causal only, no sliding window or softcap (use the "
                             "Triton backend)")
        if num_q_heads % num_kv_heads:
            raise ValueError(f"CUDA extend: {num_q_heads} query heads not a multiple of "
                             f"{num_kv_heads} KV heads")
        if block_n not in (64, 128) or not 2 <= stages or smem_bytes(stages, block_n) > 232448:
            raise ValueError(f"CUDA extend: block_n 64 or 128 and 2+ stages within 227 KB, got "
                             f"{block_n}, {stages}")
        dev = qo_indptr.device
        if dev.type != "cuda":
            raise ValueError("CUDA extend: tensors must be on a CUDA device")
        ptr, lens = _v.host_lengths(qo_indptr, seq_lens, host_qo_indptr, host_seq_lens)
        counts = np.diff(ptr)
        self.paged = paged
        if paged:
            if page_size & (page_size - 1) or not 8 <= page_size <= 256:
                raise ValueError(f"CUDA paged extend: page size a power of two in 8..256, got "
                                 f"{page_size}")
            if (lens < counts).any():
                raise ValueError("CUDA paged extend: seq_lens below the new tokens' count")
            self.page_size = page_size
        elif (counts != lens).any():
            raise ValueError("CUDA extend: every request's tokens must all be new (no cached "
                             "prefix: seq_lens == new tokens); use the Triton backend")
        self.qo_indptr, self.page_table, self.seq_lens, self.device = (qo_indptr, page_table,
                                                                       seq_lens, dev)
        self.hq, self.hkv, self.group = num_q_heads, num_kv_heads, num_q_heads // num_kv_heads
        self.q_dtype, self.scale = q_dtype, scale
        self.num_rows = int(ptr[-1]) if len(ptr) else 0
        prefixes = lens - counts
        self.splits, self.gqa_pack, work = _work_items(
            paged, *resolve_defaults(paged, splits, gqa_pack), counts, prefixes, num_q_heads,
            self.group, block_n, dev)
        if self.splits > 1:
            self.partial_o, self.partial_lse = split_kv.workspace(self.num_rows, num_q_heads,
                                                                  self.splits, dev)
            extra = (*extra, "-DSPLIT")
        if self.gqa_pack:
            extra = (*extra, "-DPACK")
        self.num_blocks = len(work)  # work items (blocks x their splits when split)
        self.ctas_per_item = num_kv_heads if self.gqa_pack else num_q_heads
        if not len(work):
            work = np.zeros((1, work.shape[1]), dtype=np.int32)
        # non_blocking: a blocking upload would wait for the stream's queued work (a sync)
        self.work = torch.from_numpy(work.reshape(-1)).to(dev, non_blocking=True)
        self.block_n = block_n
        self._fn = _function(dev, q_dtype == torch.float16, stages, block_n, tuple(extra), paged)
        self._smem = smem_bytes(stages, block_n)  # (compiled now, not inside a graph capture)

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None,
            k=None, v=None):
        """q [T, Hq, 128] -> o [T, Hq, 128]; k, v: the new tokens' K/V [T, Hkv, 128]
        (required unless the plan is paged, which reads every key from the caches)."""
        if self.paged:
            return self._run_paged(q, k_cache, v_cache, sinks, k_scale, v_scale, out)
        check_run_args(self, q, k, v, sinks, k_scale, v_scale, out)
        o = torch.empty_like(q) if out is None else out
        if self.num_blocks == 0:
            return o
        c = ctypes
        args = (tensor_map(k, self.block_n), tensor_map(v, self.block_n),
                *(c.c_uint64(t.data_ptr()) for t in (q, k, v, o, self.qo_indptr, self.work)),
                c.c_float(self.scale * LOG2E), c.c_int(self.num_rows), c.c_int(self.hq),
                c.c_int(self.group),
                *(c.c_int64(s) for s in (q.stride(0), q.stride(1), k.stride(0), v.stride(0),
                                         o.stride(0), o.stride(1))))
        _launch(self._fn, self.num_blocks * self.hq, self._smem, q.device, args)
        return o


    def _run_paged(self, q, k_cache, v_cache, sinks, k_scale, v_scale, out):
        _check_options(sinks, k_scale, v_scale)
        _check_q_out(self, q, out)
        check_cache_args(self, q, k_cache, v_cache)
        o = torch.empty_like(q) if out is None else out
        if self.num_blocks == 0:
            return o
        c = ctypes
        box = min(self.page_size, self.block_n)
        args = (tensor_map(k_cache, box), tensor_map(v_cache, box), tensor_map(k_cache, 1),
                tensor_map(v_cache, 1),
                *(c.c_uint64(t.data_ptr()) for t in (q, o, self.qo_indptr, self.work,
                                                      self.seq_lens, self.page_table)),
                c.c_float(self.scale * LOG2E), c.c_int(self.hq), c.c_int(self.group),
                c.c_int(self.page_size.bit_length() - 1),
                *(c.c_int64(s) for s in (q.stride(0), q.stride(1), o.stride(0), o.stride(1),
                                         self.page_table.stride(0))))
        if self.splits > 1:
            args += (c.c_uint64(self.partial_o.data_ptr()),
                     c.c_uint64(self.partial_lse.data_ptr()), c.c_int(self.splits))
        _launch(self._fn, self.num_blocks * self.ctas_per_item, self._smem, q.device, args)
        if self.splits > 1:
            split_kv.merge(self.partial_o, self.partial_lse, o, self.splits)
        return o


def resolve_defaults(paged: bool, splits, gqa_pack):
    """The plan's (splits, gqa_pack) with "default" replaced: DEFAULT_SPLITS /
    DEFAULT_GQA_PACK for a paged plan, 1 / False for the contiguous kernel (it has no split or
    packed build, so the defaults must not reach it: a first-turn prefill without a prefix
    takes that plan whatever the paged defaults are). Options named explicitly pass through
    (and are checked by _work_items)."""
    if isinstance(splits, str) and splits == "default":
        splits = DEFAULT_SPLITS if paged else 1
    if isinstance(gqa_pack, str) and gqa_pack == "default":
        gqa_pack = DEFAULT_GQA_PACK if paged else False
    return splits, gqa_pack


def _work_items(paged, splits, gqa_pack, counts, prefixes, hq, group, block_n, device):
    """(split count, GQA packing, work items) of a plan; the work items an int32 array of
    (request, query block) rows when unsplit, (request, query block, t0, t1, split index) rows
    when split (extend_split.py; launched in extend_split.ITEM_ORDER)."""
    if not isinstance(gqa_pack, bool):
        raise ValueError(f"CUDA extend: gqa_pack must be a bool, got {gqa_pack!r}")
    if not paged:  # the contiguous kernel has neither a split nor a packed build
        if splits is not None and (isinstance(splits, bool) or splits != 1) or gqa_pack:
            raise ValueError(f"CUDA extend: splits > 1 and gqa_pack need the paged plan, got "
                             f"splits={splits!r}, gqa_pack={gqa_pack}")
        return 1, False, work_table(counts, prefixes=prefixes)
    g = group if gqa_pack else 1
    sms = platform_of(device).num_sms if splits is None else 0
    splits = split_kv.resolve_splits(splits, counts, prefixes, hq, sms, BLOCK_M, block_n, g)
    if splits > 1:
        return splits, gqa_pack, split_kv.split_table(counts, prefixes, splits, BLOCK_M,
                                                      block_n, g)
    if gqa_pack:
        return 1, True, np.ascontiguousarray(
            split_kv.split_table(counts, prefixes, 1, BLOCK_M, block_n, g)[:, :2])
    return 1, False, work_table(counts, prefixes=prefixes)


def check_cache_args(plan, q, k_cache, v_cache) -> None:
    """The paged plan's caches: q's dtype, [pages, page_size, Hkv, 128], contiguous (seen as
    one 2-D [pages * page_size, Hkv * 128] tensor by TMA), 16-byte aligned, on q's device."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        shape_ok = t.dim() == 4 and tuple(t.shape[1:]) == (plan.page_size, plan.hkv, HEAD_DIM)
        if t.dtype != q.dtype or not shape_ok or not t.is_contiguous() or \
                t.data_ptr() % 16 or t.device != q.device:
            raise ValueError(f"CUDA paged extend: {name} must be a contiguous [pages, "
                             f"{plan.page_size}, {plan.hkv}, {HEAD_DIM}] {q.dtype} tensor on "
                             f"{q.device}, got {tuple(t.shape)} {t.dtype} strides "
                             f"{tuple(t.stride())}")


def _check_options(sinks, k_scale, v_scale) -> None:
    if sinks is not None or k_scale is not None or v_scale is not None:
        raise ValueError("CUDA extend: no attention sinks and no KV scales (16-bit cache)")


def _check_q_out(plan, q, out) -> None:
    T = plan.num_rows
    if q.dtype != plan.q_dtype or tuple(q.shape) != (T, plan.hq, HEAD_DIM) or \
            q.stride(2) != 1 or q.device != plan.device:
        raise ValueError(f"CUDA extend: q must be [{T}, {plan.hq}, {HEAD_DIM}] {plan.q_dtype} "
                         f"on {plan.device} with a contiguous last dim, got {tuple(q.shape)} "
                         f"{q.dtype} on {q.device}, strides {tuple(q.stride())}")
    if out is not None and (tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or
                            out.stride(2) != 1 or out.device != q.device):
        raise ValueError(f"CUDA extend: out must be {tuple(q.shape)} {q.dtype} with a "
                         f"contiguous last dim, got {tuple(out.shape)} {out.dtype}")
    for name, t in (("q", q), *((("out", out),) if out is not None else ())):
        if t.data_ptr() % 16 or t.stride(0) % 8 or t.stride(1) % 8:
            raise ValueError(f"CUDA extend: {name} rows must be 16-byte aligned (strides "
                             f"{tuple(t.stride())})")


def check_run_args(plan, q, k, v, sinks, k_scale, v_scale, out) -> None:
    """What `run` relies on and the kernel cannot check (host-side, no sync)."""
    _check_options(sinks, k_scale, v_scale)
    if k is None or v is None:
        raise ValueError("CUDA extend: pass the new tokens' k and v ([T, Hkv, 128]); this "
                         "kernel reads K/V from them, not from the pages")
    _check_q_out(plan, q, out)
    T = plan.num_rows
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or tuple(t.shape) != (T, plan.hkv, HEAD_DIM) or \
                t.stride(2) != 1 or t.stride(1) != HEAD_DIM or t.device != q.device:
            raise ValueError(f"CUDA extend: {name} must be [{T}, {plan.hkv}, {HEAD_DIM}] "
                             f"{q.dtype} with packed heads, got {tuple(t.shape)} {t.dtype} "
                             f"strides {tuple(t.stride())}")
        if t.data_ptr() % 16 or t.stride(0) % 8:
            raise ValueError(f"CUDA extend: {name} rows must be 16-byte aligned (strides "
                             f"{tuple(t.stride())})")


def make_plan(qo_indptr, page_table, seq_lens, **kw) -> CudaExtendPlan:
    """CUDA causal prefill plan (contiguous new K/V)."""
    return CudaExtendPlan(qo_indptr, page_table, seq_lens, **kw)


def make_paged_plan(qo_indptr, page_table, seq_lens, **kw) -> CudaExtendPlan:
    """CUDA causal extend plan reading every key from the paged cache."""
    return CudaExtendPlan(qo_indptr, page_table, seq_lens, paged=True, **kw)


TRAITS = {"head_dim": lambda d: d == HEAD_DIM, "softcap": lambda x: not x,
          "sliding_window": lambda x: not x, "sinks": lambda x: not x,
          "prefix": lambda x: not x, "causal": lambda x: bool(x), "new_kv": lambda x: bool(x)}


# what both registrations share: sm_90a only (wgmma, TMA, setmaxnreg), cuda-python at run time
REGISTRATION = dict(capability=Capability(vendors=frozenset({"nvidia"}), min_sm=90, max_sm=90,
                                          modules=frozenset({"cuda.bindings"})),
                    formats={"q": ("fp16", "bf16"), "kv": ("fp16", "bf16")},
                    band="specialized", tags=("deterministic", "throughput"),
                    compiled=("sm_90",))


register("attention", "extend", backend="cuda", traits=TRAITS, **REGISTRATION, plan=make_plan,
         description="CUDA causal prefill (wgmma, sm_90a) of requests with no cached prefix.")


PAGED_TRAITS = {"head_dim": lambda d: d == HEAD_DIM, "softcap": lambda x: not x,
                "sliding_window": lambda x: not x, "sinks": lambda x: not x,
                "causal": lambda x: bool(x),
                "page_size": lambda p: 8 <= p <= 256 and p & (p - 1) == 0}


# The same kernel reading every key from the paged cache (-DPAGED): chunked prefill over a
# cached prefix, the agentic turn's shape (run-verified on sm_90; the contiguous
# kernel above ranks first where both apply: it is faster without a prefix).
register("attention", "extend", backend="cuda_paged", traits=PAGED_TRAITS, **REGISTRATION,
         plan=make_paged_plan,
         description="CUDA causal extend (wgmma + TMA from the paged cache, sm_90a), any "
                     "cached prefix.")
