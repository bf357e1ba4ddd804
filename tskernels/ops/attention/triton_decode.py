"""Triton paged decode attention: GQA-grouped, split-KV, with a plan/run split.

Math (per request b, query head h, KV head kv = h // G, visible keys j in [lo, L)):
    s_j = scale * k_scale[kv] * (q_h . K_j)      (fp8 cache: K_j dequantized by its scale)
    s_j = c * tanh(s_j / c)                      if softcap c
    o_h = v_scale[kv] * sum_j exp(s_j) V_j / (sum_j exp(s_j) + exp(sink_h))
with L = seq_lens[b], lo = max(0, L - W) for a sliding window W, else 0.

One program owns (split, KV head, request) and all G query heads of that KV head, so every KV
page is read from memory once per KV head. Two forms of the tile dots:
  - query heads on the M side (16-bit caches): [G x D] @ [D x N], the G heads padded to 16
    rows (mma.sync); decode is memory-bound, the wasted rows cost nothing measurable;
  - keys on the M side (fp8 caches): s^T = K q^T and o^T += V^T p^T, 64-key tiles (wgmma on
    sm_90). q is split into two e4m3 terms (hi + lo, each with a per-row scale: bf16's
    precision), so the fp8 keys feed e4m3 dots straight from shared memory, never converted;
    V is converted to fp16 for the second dot (an e4m3 dot would need V^T keys-contiguous).
    H200: 1.31x the bf16 kernel's tokens/s at B=128, L=8k, against 1.0x when both K and V
    were converted (benchmarks/RESULTS.md, "attention.decode": kernel forms).
Key positions are mapped to (page, slot) per token, so any page size works and a block of keys
may straddle pages; each tile's page ids are loaded one tile ahead.

Split-KV: `DecodePlan` fixes num_splits per batch (enough programs to fill the GPU); each split
takes an equal, BLOCK_N-aligned share of the visible keys, computed on the device from
seq_lens, so a captured CUDA graph stays correct when the lengths change between replays.
With one split the kernel finalises directly; otherwise it writes (o, lse) partials into the
plan's workspace and the last split program of each (request, KV head) merges them (<= 2
splits) or `merge_kernel` does, launched as a programmatic dependent of the decode kernel on
sm_90+ so its launch overlaps the decode. `DecodePlan.run` does no host synchronisation and
allocates nothing when given `out`.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from autotune import backend_options

from ... import tuning
from ...compile import CompileCase
from ...platform import platform_of
from ...plan import PlanBase
from ...registry import register
from .._common import TRITON
from ..shared import pdl
from ..shared.split_kv import choose_splits, merge_group, merge_kernel, merge_warps
# the decode space lives in the family tuning module (attention/_tune.py) with the others
from ._tune import DECODE as SPACE, DECODE_KERNEL as TUNE_KERNEL  # noqa: F401
from ._tune import decode_problem as tune_problem
from ._validate import KV_FORMATS
from ..shared.triton_math import LN2, LOG2E, fp8_to_f16, kv_scales, safe_tanh

LONG_CHUNK = 768  # keys per split below which long contexts stop taking more splits

FUSED_MERGE_MAX_SPLITS = 2
# The split count stays the capacity's (choose_splits at max_seq_len), even for a short live
# context: sizing it by the live length per run (choose_splits at L inside the kernel, the
# splits past it empty) was slower on the H100 at every length, B = 1, bf16, d 128, graph
# replay (benchmarks/RESULTS.md, "Session 27"): Qwen3-30B-A3B heads at 176 keys 6.61 us on 64
# near-empty splits vs 8.74 on 2 full ones, 1024 keys 7.78 vs 9.61; Qwen3-30B-A3B B = 1
# serving 2.98 vs 3.09 ms/step. A split's keys are a serial chain of tile loads; 64 one-tile
# splits and a 64-row merge are shorter than 2 two-tile splits.


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, pt_ptr, lens_ptr, ks_ptr, vs_ptr, sink_ptr,
                   o_ptr, po_ptr, plse_ptr, sem_ptr, sm_scale, softcap, window, num_splits,
                   q_sb, q_sh, k_sp, k_ss, k_sh, v_sp, v_ss, v_sh, pt_sb, o_sb, o_sh,
                   G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, SCALED: tl.constexpr, PER_HEAD: tl.constexpr,
                   SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, SINKS: tl.constexpr,
                   IEEE: tl.constexpr, FP8_ASM: tl.constexpr = False,
                   FUSED_MERGE: tl.constexpr = False, BLOCK_S: tl.constexpr = 2,
                   KEYS_M: tl.constexpr = False, Q_FP8: tl.constexpr = False,
                   PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()  # the merge kernel may be scheduled now (it waits for us)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    b = tl.program_id(2).to(tl.int64)
    L = tl.load(lens_ptr + b)
    lo = 0
    if WINDOW:
        lo = tl.maximum(L - window, 0)
    chunk = tl.cdiv(tl.cdiv(L - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, L)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gm = g < G
    dm = d < D
    qh = kvh * G + g
    q = tl.load(q_ptr + b * q_sb + qh[:, None] * q_sh + d[None, :],
                mask=gm[:, None] & dm[None, :], other=0.0)
    if FP8_ASM:
        # fp8 cache: fp8 -> fp16 is one cvt per pair (-> bf16 would take two steps), so the
        # dots run in fp16 (q's magnitude is far below fp16's 65504 in practice).
        q = q.to(tl.float16)
    qk_scale, v_scale = kv_scales(ks_ptr, vs_ptr, kvh, sm_scale, SCALED, PER_HEAD)
    if Q_FP8:
        # fp8 cache: q as two e4m3 terms, hi = e4m3(q * qs) with one scale per head row (its
        # max |q| -> 448) and lo = e4m3((q * qs - hi) * rs), the rounding residual with its
        # own row scale: hi + lo keeps ~8 significant bits (bf16's precision; hi alone has 4,
        # ~4 % error on the logits), and both feed e4m3 tensor-core dots that read the fp8
        # keys straight from shared memory: K is never converted.
        qf = q.to(tl.float32)
        qmax = tl.max(tl.abs(qf), 1)
        qs = tl.where(qmax > 0, 448.0 / tl.where(qmax > 0, qmax, 1.0), 1.0)
        q8 = (qf * qs[:, None]).to(tl.float8e4nv)
        r = qf * qs[:, None] - q8.to(tl.float32)
        rmax = tl.max(tl.abs(r), 1)
        rs = tl.where(rmax > 0, 448.0 / tl.where(rmax > 0, rmax, 1.0), 1.0)
        q8lo = (r * rs[:, None]).to(tl.float8e4nv)
        s_col = qk_scale / qs
        s_col_lo = qk_scale / (qs * rs)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    if KEYS_M:
        acc_t = tl.zeros([BLOCK_D, BLOCK_G], tl.float32)
    else:
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    pt_row = pt_ptr + b * pt_sb
    k_base = k_ptr + kvh * k_sh
    v_base = v_ptr + kvh * v_sh
    t = start + tl.arange(0, BLOCK_N)
    page_next = tl.load(pt_row + t // PAGE, mask=t < end, other=0)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tm = t < end
        # this tile's page ids were loaded one iteration ahead; issue the next tile's now, so
        # its K/V loads do not wait on a page-table round trip
        page = page_next.to(tl.int64)
        tn = t + BLOCK_N
        page_next = tl.load(pt_row + tn // PAGE, mask=tn < end, other=0)
        slot = t % PAGE
        km = tm[:, None] & dm[None, :]
        k = tl.load(k_base + (page * k_sp + slot * k_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
        v = tl.load(v_base + (page * v_sp + slot * v_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
        if KEYS_M:
            # keys on the M side: s^T = K q^T and o^T += V^T p^T are [BLOCK_N x G] and
            # [D x G] tensor-core dots with M = keys / head dim (wgmma on sm_90), the query
            # heads on the narrow N side.
            if Q_FP8:
                st = tl.dot(k, tl.trans(q8)) * s_col[None, :] \
                    + tl.dot(k, tl.trans(q8lo)) * s_col_lo[None, :]
            elif FP8_ASM:
                st = tl.dot(fp8_to_f16(k), tl.trans(q)) * qk_scale
            else:
                st = tl.dot(k.to(q.dtype), tl.trans(q)) * qk_scale
            if SOFTCAP:
                st = softcap * safe_tanh(st / softcap)
            st = tl.where(tm[:, None], st * LOG2E, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 0))
            alpha = tl.exp2(m_i - m_new)
            pt = tl.exp2(st - m_new[None, :])
            l_i = l_i * alpha + tl.sum(pt, 0)
            # V stays a 16-bit operand: an e4m3 dot would need V^T K-major (keys contiguous),
            # a byte-wise transpose in shared memory that measured 2x slower on the H200
            # ("q_fp8+pv_fp8"); V pages stored slots-innermost were slower still in Triton 3.6
            # (benchmarks/RESULTS.md, "attention.decode": kernel forms)
            if FP8_ASM:
                acc_t = tl.dot(tl.trans(fp8_to_f16(v)), pt.to(q.dtype), acc_t * alpha[None, :])
            else:
                acc_t = tl.dot(tl.trans(v.to(q.dtype)), pt.to(q.dtype), acc_t * alpha[None, :])
            m_i = m_new
        elif IEEE:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee")
        elif FP8_ASM:
            s = tl.dot(q, tl.trans(fp8_to_f16(k)))
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
        if not KEYS_M:
            s = s * qk_scale
            if SOFTCAP:
                s = softcap * safe_tanh(s / softcap)
            s = tl.where(tm[None, :], s * LOG2E, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            elif FP8_ASM:
                acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), fp8_to_f16(v))
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
            m_i = m_new

    if KEYS_M:
        acc = tl.trans(acc_t)
    acc = acc * v_scale
    if SPLIT:
        # Partial over this split's keys: normalised o and natural-log lse (-inf when empty).
        has = l_i > 0
        o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * LN2, float("-inf"))
        row = (b * (G * num_kv_heads) + qh) * num_splits + split
        tl.store(po_ptr + row[:, None] * BLOCK_D + d[None, :], o, mask=gm[:, None])
        tl.store(plse_ptr + row, lse, mask=gm)
        if FUSED_MERGE:
            # The last split of (request, KV head) to finish merges all of them: every thread's
            # partial stores complete (barrier) before one release-add counts this program in;
            # the acquiring last program reads the others' partials past L1 (.cg).
            tl.debug_barrier()
            sem = sem_ptr + b * num_kv_heads + kvh
            done = tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu")
            if done == num_splits - 1:
                tl.store(sem, 0)  # re-armed for the next launch (stream-ordered)
                merge_group(po_ptr, plse_ptr, sink_ptr, o_ptr, b, kvh * G, num_splits,
                             G * num_kv_heads, o_sb, o_sh, G, D, BLOCK_D, BLOCK_S, SINKS)
    else:
        if SINKS:
            sink = tl.load(sink_ptr + qh, mask=gm, other=0.0) * LOG2E
            m_tot = tl.maximum(m_i, sink)
            r = tl.exp2(m_i - m_tot)
            l_i = l_i * r + tl.exp2(sink - m_tot)
            acc = acc * r[:, None]
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + b * o_sb + qh[:, None] * o_sh + d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=gm[:, None] & dm[None, :])


def _launch_config(head_dim: int, kv_dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) when no tuned entry matches: 2 stages (one K/V tile in
    flight while one is consumed). H200 (benchmarks/RESULTS.md, "attention.decode"): with
    the page ids prefetched a tile ahead the K/V loads pipeline, and a third stage costs
    a 32 KB buffer (bf16, 64 keys) that drops residency from 5 to 3 programs per SM: 2 stages
    lead at every large shape (B=64 L=4k 250 vs 291 µs). 16-bit caches: ~32 KB of K+V per
    stage; fp8 caches (keys on the M side): 64-key tiles, one wgmma M block."""
    if kv_dtype.itemsize == 1:
        return 64, 4, 2
    block_d = triton.next_power_of_2(head_dim)
    return max(16, min(64, 8192 // block_d)), 4, 2


# AMD CDNA (wave 64) per arch: heuristic, not run (no AMD GPU); the compile matrix shows MFMA,
# no scratch and LDS within the arch. num_stages: gfx942 keeps one K/V buffer in LDS (32 KB at
# 2 stages: two workgroups per CU in its 64 KB), gfx950 two (64 KB of its 160 KB at 3)
CDNA_STAGES = {"gfx942": 2, "gfx950": 3}
# 16x16 MFMA: the 16-row query-head block is one MFMA row block. waves_per_eu=3 (<= 168
# VGPRs, 3 waves per SIMD for the memory-bound loop) where it fits without scratch: gfx950;
# gfx942 keeps 2 (<= 256 VGPRs): at 3 the fp8 form spilled 112 B and the 16-bit one 28 B
CDNA_OPTIONS = {"gfx942": ({"matrix_instr_nonkdim": 16, "waves_per_eu": 2},
                           {"matrix_instr_nonkdim": 16, "waves_per_eu": 2}),
                "gfx950": ({"matrix_instr_nonkdim": 16, "waves_per_eu": 3},
                           {"matrix_instr_nonkdim": 16, "waves_per_eu": 3})}


def cdna_launch(arch: str, fp8: bool) -> tuple[int, dict]:
    """(num_stages, backend options) of the decode kernel on gfx942 / gfx950 (fp8: an e4m3
    cache, the keys-on-M form)."""
    return CDNA_STAGES[arch], dict(CDNA_OPTIONS[arch][fp8])


def _tuned(device, head_dim, kv_dtype, group, batch_x_kv_heads, max_seq_len):
    """The tuned config for this bucket on this device through the lookup chain (None off
    CUDA: the interpreter and CPU use the plan's own choices)."""
    if device.type != "cuda":
        return None
    # 16-bit caches share entries (same bytes per key); fp32 caches have none of their own
    kv = {1: "fp8", 2: "bf16"}.get(kv_dtype.itemsize, "fp32")
    return tuning.choice(SPACE, tune_problem(head_dim, kv, group, batch_x_kv_heads,
                                             max_seq_len), device)


class DecodePlan(PlanBase):
    """Per-batch decode metadata and workspace; `run` is CUDA-graph capturable.

    Build once per batch (`attention.decode_plan`), reuse for every layer. page_table and
    seq_lens are held by reference: update their contents in place between graph replays.
    """

    KERNEL = "attention.decode.triton"
    REPR_FIELDS = ("batch", "hq", "hkv", "d", "page_size", "num_splits", "block_n",
                   "num_warps", "num_stages", "keys_m", "fused_merge", "pdl", "tuned_from")

    def __init__(self, page_table, seq_lens, *, num_q_heads, num_kv_heads, head_dim,
                 page_size, q_dtype, kv_dtype, scale, sliding_window=None, softcap=None,
                 max_seq_len=None, num_splits=None, block_n=None, num_warps=None,
                 num_stages=None, waves_per_eu=None, matrix_instr_nonkdim=None):
        self.page_table, self.seq_lens = page_table, seq_lens
        self.batch = page_table.shape[0]
        self.hq, self.hkv, self.d = num_q_heads, num_kv_heads, head_dim
        self.group = num_q_heads // num_kv_heads
        self.page_size, self.q_dtype, self.kv_dtype = page_size, q_dtype, kv_dtype
        self.scale, self.window, self.softcap = scale, sliding_window, softcap
        dev = page_table.device
        if max_seq_len is None:  # an upper bound that needs no host sync
            max_seq_len = page_table.shape[1] * page_size
        if sliding_window:
            max_seq_len = min(max_seq_len, sliding_window)
        choice = _tuned(dev, head_dim, kv_dtype, self.group, self.batch * num_kv_heads,
                        max_seq_len)
        tuned = choice.config if choice is not None else {}
        self.tuned_from = choice.link if choice is not None else "heuristic"
        bn, nw, ns = _launch_config(head_dim, kv_dtype)
        self.launch_options = {}
        plat = platform_of(dev) if dev.type == "cuda" and torch.version.hip else None
        if plat is not None and plat.arch in CDNA_STAGES:  # AMD CDNA: its own stages / knobs
            ns, self.launch_options = cdna_launch(plat.arch, kv_dtype == torch.float8_e4m3fn)
            self.launch_options.update(backend_options(tuned))
            self.launch_options.update({k: v for k, v in (("waves_per_eu", waves_per_eu), (
                "matrix_instr_nonkdim", matrix_instr_nonkdim)) if v is not None})
        self.block_n = block_n or tuned.get("block_n", bn)
        self.num_warps = num_warps or tuned.get("num_warps", nw)
        self.num_stages = num_stages or tuned.get("num_stages", ns)
        num_splits = num_splits or tuned.get("num_splits")
        self.block_d = max(16, triton.next_power_of_2(head_dim))
        nvidia = dev.type == "cuda" and torch.version.hip is None
        cc = torch.cuda.get_device_capability(dev) if nvidia else (0, 0)
        # e4m3 -> f16 by PTX cvt (sm_89+); sm_100's software pipeliner rejects the inline asm
        # in the keys-on-M loop (compile matrix), so it casts like the other targets
        self.fp8_asm = kv_dtype == torch.float8_e4m3fn and nvidia and cc >= (8, 9) \
            and cc[0] != 10
        self.block_g = max(16, triton.next_power_of_2(self.group))
        # Kernel form: "keys_m" puts the keys on the tensor-core M side (s^T = K q^T), which
        # an fp8 cache needs so K feeds e4m3 dots unconverted (q split hi + lo); 16-bit caches
        # keep the query heads on M (mma.sync over 16 rows), 4-34 % faster for them (H200,
        # benchmarks/RESULTS.md, "attention.decode": kernel forms).
        # (e4m3 dots need K >= 32: head dims <= 16 keep the converting form)
        self.keys_m = bool(tuned.get("keys_m", kv_dtype == torch.float8_e4m3fn
                                     and self.block_d >= 32))
        # The separate merge is a programmatic dependent launch (sm_90+ CUDA): the decode
        # kernel lets it launch at once (griddepcontrol.launch_dependents) and it waits for
        # the decode grid's results (griddepcontrol.wait), so its launch latency is hidden.
        self.pdl = nvidia and cc[0] >= 9
        sms = platform_of(dev).num_sms if dev.type == "cuda" else 4
        # more splits over long contexts for 16-bit caches (measured there; fp8 caches not)
        self.num_splits = num_splits or choose_splits(
            self.batch, num_kv_heads, max_seq_len, sms, self.block_n,
            long_chunk=LONG_CHUNK if kv_dtype != torch.float8_e4m3fn else None)
        n = self.batch * num_q_heads * self.num_splits
        # split-KV partials merged by the last split program of each (request, KV head)
        # (counted on a per-plan semaphore) instead of a second launch, only when the splits
        # are very few. H200, graph replay (benchmarks/RESULTS.md, "attention.decode": merge
        # policy): equal at 2 splits (B=16: 85.6 vs 86.2 µs), behind at 4-32 (B=16 4 splits 75.2 vs
        # 71.3, B=1 32 splits 17.9 vs 15.4): the merging program is a serial tail that costs
        # more than the launch it saves; eagerly it saves a ~30 µs launch (B=16 4 splits:
        # 70.8 vs 87.4 µs). Not chosen per call (eager vs
        # capturing): a graph capture would then JIT-compile the other variant mid-capture.
        self.fused_merge = self.num_splits <= FUSED_MERGE_MAX_SPLITS
        if self.num_splits > 1:
            self.partial_o = torch.empty(n, self.block_d, dtype=torch.float32, device=dev)
            self.partial_lse = torch.empty(n, dtype=torch.float32, device=dev)
            self.semaphore = torch.zeros(self.batch * num_kv_heads, dtype=torch.int32,
                                         device=dev)
        else:
            self.partial_o = self.partial_lse = self.semaphore = None

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None):
        """q [B, Hq, D] -> o [B, Hq, D] (into `out` when given). No sync, no allocation with
        `out`. Scales/sinks as in `attention.decode`."""
        B = self.batch
        o = torch.empty_like(q) if out is None else out
        if B == 0:
            return o
        split = self.num_splits > 1
        scaled = k_scale is not None
        fp8 = k_cache.dtype == torch.float8_e4m3fn
        keys_m = self.keys_m and q.dtype != torch.float32 and not (fp8 and self.block_d < 32)
        dummy = self.seq_lens
        po = self.partial_o if split else o
        plse = self.partial_lse if split else dummy
        _decode_kernel[(self.num_splits, self.hkv, B)](
            q, k_cache, v_cache, self.page_table, self.seq_lens,
            k_scale if scaled else dummy, v_scale if scaled else dummy,
            sinks if sinks is not None else dummy, o, po, plse,
            self.semaphore if split else dummy, self.scale,
            float(self.softcap or 1.0), int(self.window or 0), self.num_splits,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), self.page_table.stride(0),
            o.stride(0), o.stride(1),
            G=self.group, BLOCK_G=self.block_g, D=self.d, BLOCK_D=self.block_d,
            PAGE=self.page_size, BLOCK_N=self.block_n, SPLIT=split, SCALED=scaled,
            PER_HEAD=scaled and k_scale.numel() > 1, SOFTCAP=bool(self.softcap),
            WINDOW=bool(self.window), SINKS=sinks is not None,
            IEEE=q.dtype == torch.float32, FP8_ASM=self.fp8_asm and q.dtype != torch.float32,
            FUSED_MERGE=split and self.fused_merge,
            PDL=split and not self.fused_merge and self.pdl,
            KEYS_M=keys_m, Q_FP8=keys_m and fp8,
            BLOCK_S=max(2, triton.next_power_of_2(self.num_splits)),
            num_warps=self.num_warps,
            num_stages=self.num_stages, **self.launch_options)
        if split and not self.fused_merge:
            bs = max(2, triton.next_power_of_2(self.num_splits))
            merge_kernel[(self.hq, B)](
                self.partial_o, self.partial_lse, sinks if sinks is not None else dummy, o,
                self.num_splits, self.hq, o.stride(0), o.stride(1), D=self.d,
                BLOCK_D=self.block_d, BLOCK_S=bs, SINKS=sinks is not None, PDL=self.pdl,
                TRIGGER=self.pdl and pdl.chained("merge"),
                num_warps=merge_warps(bs, self.block_d),
                **({"launch_pdl": True} if self.pdl else {}))
        return o




def _cases():
    out = []
    strides = ("q_sb", "q_sh", "k_sp", "k_ss", "k_sh", "v_sp", "v_ss", "v_sh", "pt_sb",
               "o_sb", "o_sh")  # multiples of 16 at run time (the JIT specialises them)
    nvidia = ("sm_90", "sm_100", "sm_120")
    for kv_t, scaled, per_head in (("*bf16", False, False), ("*fp8e4nv", True, True)):
        sig = {"q_ptr": "*bf16", "k_ptr": kv_t, "v_ptr": kv_t, "pt_ptr": "*i32",
               "lens_ptr": "*i32", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "sink_ptr": "*fp32",
               "o_ptr": "*bf16", "po_ptr": "*fp32", "plse_ptr": "*fp32", "sem_ptr": "*i32",
               "sm_scale": "fp32",
               "softcap": "fp32", "window": "i32", "num_splits": "i32"}
        sig.update({k: "i32" for k in strides})
        fp8 = kv_t == "*fp8e4nv"
        for split in (False, True):
            # the forms plans launch: an fp8 cache puts the keys on the M side with q split
            # into two e4m3 terms (BLOCK_N 64, 2 stages as tuned); on NVIDIA sm_89+ except
            # sm_100 V is converted by inline PTX (sm_100's pipeliner rejects it), elsewhere
            # by a plain cast. A separate merge (split, not fused) is a programmatic dependent
            # launch on NVIDIA.
            c = dict(G=4, BLOCK_G=16, D=128, BLOCK_D=128, PAGE=16, BLOCK_N=64, SPLIT=split,
                     SCALED=scaled, PER_HEAD=per_head, SOFTCAP=split, WINDOW=split,
                     SINKS=not split, IEEE=False, FUSED_MERGE=False, BLOCK_S=4 if split else 2,
                     KEYS_M=fp8, Q_FP8=fp8, FP8_ASM=False, PDL=False)
            variants = [(c, None, "")]
            if split:
                variants = [(dict(c, FUSED_MERGE=True), None, "_fused"), (c, None, ""),
                            (dict(c, PDL=True), nvidia, "_pdl")]
            if fp8:
                variants += [(dict(v, FP8_ASM=True), ("sm_90", "sm_120"), sfx + "_ptx")
                             for v, _, sfx in list(variants)]
            # the 16-row form (16-bit caches) is below wgmma's M=64: sm_90/sm_100 lower it to
            # mma.sync (narrow_dot). The keys-on-M form (fp8) is a 64-row dot: wgmma / tcgen05.
            for cv, targets, sfx in variants:
                out.append(CompileCase(_decode_kernel, sig, cv, uses_dot=True,
                                       narrow_dot=not fp8, num_stages=2,
                                       label=f"{kv_t[1:]}{'_split' if split else ''}{sfx}",
                                       aligned=strides, targets=targets))
            if fp8 and not split:
                # head dim 16 with an fp8 cache: the converting form (e4m3 dots need K >= 32)
                out.append(CompileCase(_decode_kernel, sig,
                                       dict(c, D=16, BLOCK_D=16, KEYS_M=False, Q_FP8=False),
                                       num_stages=2, uses_dot=True, narrow_dot=True,
                                       label="fp8e4nv_d16", aligned=strides))
    msig = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "sink_ptr": "*fp32", "o_ptr": "*bf16",
            "num_splits": "i32", "H": "i32", "o_sb": "i32", "o_sh": "i32"}
    mc = dict(D=128, BLOCK_D=128, BLOCK_S=16, SINKS=True, PDL=False, ROW=0)
    out.append(CompileCase(merge_kernel, msig, mc, num_warps=1, label="merge"))
    out.append(CompileCase(merge_kernel, msig, dict(D=512, BLOCK_D=64, BLOCK_S=64, SINKS=False,
                                                     PDL=False, ROW=512), num_warps=4,
                           label="merge_mla_chunks"))
    out.append(CompileCase(merge_kernel, msig, dict(mc, PDL=True), num_warps=1,
                           label="merge_pdl", targets=nvidia))
    # the dot cases above carry the NVIDIA launches; CDNA builds them with its own stages and
    # backend options (DecodePlan on gfx942 / gfx950)
    nv = tuple(t for t in TRITON["compiled"] if t.startswith("sm_"))
    cdna = []
    for c in out:
        if c.uses_dot and c.targets is None:
            for arch in CDNA_STAGES:
                ns, opts = cdna_launch(arch, "fp8" in c.signature["k_ptr"])
                cdna.append(dataclasses.replace(c, num_stages=ns, targets=(arch,),
                                                options=tuple(opts.items()),
                                                label=f"{c.label}_{arch}"))
    out = [dataclasses.replace(c, targets=nv) if c.uses_dot and c.targets is None else c
           for c in out]
    return out + cdna


def _decode_traits():
    return {"head_dim": lambda d: 16 <= d <= 256, "page_size": lambda p: 1 <= p <= 256,
            "gqa": lambda g: 1 <= g <= 64}


register("attention", "decode", **TRITON, formats={"q": ("fp32", "fp16", "bf16"),
                                                   "kv": KV_FORMATS},
         traits=_decode_traits(), tags=("deterministic", "latency", "throughput"),
         compile_cases=_cases, plan=DecodePlan,
         description="Triton paged GQA decode, split-KV (plan once per batch, run per layer).")
