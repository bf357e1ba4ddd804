"""Triton paged extend attention (prefill and chunked prefill of a ragged batch), causal.

Math: as `attention.extend` (tskernels_ref.attention.extend): request b's n_b new queries sit at
positions p = L_b - n_b + m (m < n_b); query p sees cached keys j <= p (and j > p - W with a
sliding window W), logits scaled, optionally soft-capped, softmax with an optional sink logit.

A program owns one BLOCK_M block of one request's queries and one query head, and runs a flash
loop over its visible keys, gathered from pages token by token (any page size). Keys every
query of the block may see are processed without masks; only the diagonal band (and all
blocks under a sliding window) pay for the mask. `ExtendPlan` lists the (request, query block)
pairs once per batch, longest work first (across heads: the grid's fastest axis is the head),
so `run` launches one grid with no host sync.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from ...plan import PlanBase
from ...platform import platform_of
from ...registry import register
from .._common import TRITON
from . import _tune, _validate as v_
from ..shared.triton_math import LOG2E, kv_scales, safe_tanh
from ._validate import KV_FORMATS


@triton.jit
def _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, kdesc, vdesc, row0, col, j0, m_pos,
                  Lk, window, softcap, c, d, dm, k_sp, k_ss, v_sp, v_ss, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                  SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
                  CONTIG: tl.constexpr):
    """One key tile j0 .. j0 + BLOCK_N (absolute positions) of the flash loop. CONTIG: the tile
    is read from the new tokens' contiguous K/V (tensor descriptors, rows row0 + j0 - ...);
    otherwise gathered from the pages. Keys at or past Lk are masked (MASK tiles only).
    c folds the softmax scale and log2(e) (without softcap): logits enter exp2 through one FMA."""
    j = j0 + tl.arange(0, BLOCK_N)
    jm = j < Lk
    if CONTIG:
        k = kdesc.load([row0, col])
    else:
        page = tl.load(pt_row + j // PAGE, mask=jm, other=0).to(tl.int64)
        slot = j % PAGE
        km = jm[:, None] & dm[None, :]
        k = tl.load(k_base + (page * k_sp + slot * k_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if SOFTCAP:  # c = scale here; the capped logit is then taken to base 2
        s = softcap * safe_tanh(s * (c / softcap)) * LOG2E
    if MASK:
        ok = jm[None, :] & (m_pos[:, None] >= 0)
        if CAUSAL:
            ok = ok & (j[None, :] <= m_pos[:, None])
        if WINDOW:
            ok = ok & (j[None, :] > m_pos[:, None] - window)
        s = tl.where(ok, s, float("-inf"))
    if SOFTCAP:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    if MASK:  # a row with nothing visible yet keeps m = -inf: exp2 against 0 instead
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    alpha = tl.exp2(m_i - m_new_safe)
    if SOFTCAP:
        p = tl.exp2(s - m_new_safe[:, None])
    else:
        p = tl.exp2(s * c - m_new_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if CONTIG:
        v = vdesc.load([row0, col])
    else:
        v = tl.load(v_base + (page * v_sp + slot * v_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
    acc = acc * alpha[:, None]
    if IEEE:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc)
    return acc, m_new, l_i


@triton.jit
def _extend_kernel(q_ptr, k_ptr, v_ptr, kn_ptr, vn_ptr, qo_ptr, pt_ptr, lens_ptr, work_ptr,
                   ks_ptr, vs_ptr, sink_ptr, o_ptr, sm_scale, softcap, window, num_rows,
                   q_st, q_sh, k_sp, k_ss, k_sh, v_sp, v_ss, v_sh, kn_st, vn_st, pt_sb, o_st,
                   o_sh, G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SCALED: tl.constexpr,
                   PER_HEAD: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
                   SINKS: tl.constexpr, IEEE: tl.constexpr, CONTIG: tl.constexpr = False):
    # one program per (work item, head), heads fastest: programs start in work-list order
    # across all heads, so the longest query blocks of every head run first and the short
    # ones fill the last wave (a flat grid: no 65535 limit on the work list)
    pid = tl.program_id(0)
    h = pid % (G * HKV)
    w = pid // (G * HKV)
    kvh = h // G
    b = tl.load(work_ptr + 2 * w).to(tl.int64)
    m0 = tl.load(work_ptr + 2 * w + 1) * BLOCK_M
    q_start = tl.load(qo_ptr + b)
    n = tl.load(qo_ptr + b + 1) - q_start
    L = tl.load(lens_ptr + b)
    P = L - n  # cached prefix length; the new tokens sit at positions P .. L - 1
    m = m0 + tl.arange(0, BLOCK_M)
    mm = m < n
    m_pos = P + m  # absolute positions of this block's queries
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    rows = (q_start + m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * q_st + h * q_sh + d[None, :],
                mask=mm[:, None] & dm[None, :], other=0.0)
    qk_scale, v_scale = kv_scales(ks_ptr, vs_ptr, kvh, sm_scale, SCALED, PER_HEAD)
    c = qk_scale
    if not SOFTCAP:
        c = qk_scale * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pt_row = pt_ptr + b * pt_sb
    k_base = k_ptr + kvh * k_sh
    v_base = v_ptr + kvh * v_sh
    first_pos = P + m0
    last_pos = tl.minimum(first_pos + BLOCK_M, L) - 1
    lo = 0
    if WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
    if CONTIG:
        # prefix keys (< P) from the pages, the new tokens' keys from their contiguous K/V
        kdesc = tl.make_tensor_descriptor(kn_ptr, shape=[num_rows, HKV * D], strides=[kn_st, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        vdesc = tl.make_tensor_descriptor(vn_ptr, shape=[num_rows, HKV * D], strides=[vn_st, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        col = kvh * D
        pfull = P // BLOCK_N * BLOCK_N  # prefix tiles every query sees in full
        if WINDOW:
            pfull = lo
        for j0 in range(lo, pfull, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, kdesc,
                                          vdesc, 0, col, j0, m_pos, P, window, softcap, c, d,
                                          dm, k_sp, k_ss, v_sp, v_ss, PAGE, BLOCK_N, False,
                                          CAUSAL, SOFTCAP, WINDOW, IEEE, False)
        for j0 in range(pfull, P, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, kdesc,
                                          vdesc, 0, col, j0, m_pos, P, window, softcap, c, d,
                                          dm, k_sp, k_ss, v_sp, v_ss, PAGE, BLOCK_N, True,
                                          CAUSAL, SOFTCAP, WINDOW, IEEE, False)
        # new tokens: tiles t0 .. t0 + BLOCK_N of this request's rows (absolute j = P + t0);
        # rows past the request belong to the next one or lie outside the tensor (zeros) and
        # are masked by causality in the diagonal tiles
        tlo = 0
        if WINDOW:
            tlo = tl.maximum(first_pos - window + 1 - P, 0) // BLOCK_N * BLOCK_N
        tfull = m0 // BLOCK_N * BLOCK_N
        if WINDOW:
            tfull = tlo
        for t0 in range(tlo, tfull, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, kdesc,
                                          vdesc, q_start + t0, col, P + t0, m_pos, L, window,
                                          softcap, c, d, dm, k_sp, k_ss, v_sp, v_ss, PAGE,
                                          BLOCK_N, False, CAUSAL, SOFTCAP, WINDOW, IEEE, True)
        for t0 in range(tfull, last_pos + 1 - P, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, kdesc,
                                          vdesc, q_start + t0, col, P + t0, m_pos, L, window,
                                          softcap, c, d, dm, k_sp, k_ss, v_sp, v_ss, PAGE,
                                          BLOCK_N, True, CAUSAL, SOFTCAP, WINDOW, IEEE, True)
    else:
        hi = L
        if CAUSAL:
            hi = last_pos + 1
        # Keys below `full` are visible to every query of the block: no mask needed.
        full = lo
        if not WINDOW:
            full = hi // BLOCK_N * BLOCK_N
            if CAUSAL:
                full = (first_pos + 1) // BLOCK_N * BLOCK_N
        for j0 in range(lo, full, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, 0, 0, 0, 0,
                                          j0, m_pos, L, window, softcap, c, d, dm, k_sp, k_ss,
                                          v_sp, v_ss, PAGE, BLOCK_N, False, CAUSAL, SOFTCAP,
                                          WINDOW, IEEE, False)
        for j0 in range(full, hi, BLOCK_N):
            acc, m_i, l_i = _extend_block(acc, m_i, l_i, q, k_base, v_base, pt_row, 0, 0, 0, 0,
                                          j0, m_pos, L, window, softcap, c, d, dm, k_sp, k_ss,
                                          v_sp, v_ss, PAGE, BLOCK_N, True, CAUSAL, SOFTCAP,
                                          WINDOW, IEEE, False)
    acc = acc * v_scale
    if SINKS:
        sink = tl.load(sink_ptr + h) * LOG2E
        m_tot = tl.maximum(m_i, sink)
        r = tl.exp2(m_i - m_tot)
        l_i = l_i * r + tl.exp2(sink - m_tot)
        acc = acc * r[:, None]
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows[:, None] * o_st + h * o_sh + d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=mm[:, None] & dm[None, :])


# AMD CDNA (wave 64): heuristic launch configs of the 16-bit paths, per arch. No AMD GPU ran
# them; the compile matrix shows MFMA, no scratch and LDS within the arch for each (d = 128).
CDNA_ARCHS = ("gfx942", "gfx950")
# backend options of every CDNA launch: 2 waves per SIMD leave 256 VGPRs a lane, which the
# tiles below fit without scratch; 16x16 MFMA (not 32x32) keeps the online softmax's row
# statistics in fewer lanes, as AMD's own Triton attention kernels do
CDNA_OPTIONS = {"waves_per_eu": 2, "matrix_instr_nonkdim": 16}


def _cdna_config(arch: str, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) on gfx942 / gfx950."""
    # gfx942 (64 KB LDS): one stage, a 64-key K + V tile is 32 KB and a second one would leave
    # no room for a second workgroup per CU; gfx950 (160 KB LDS) takes two
    ns = 2 if arch == "gfx950" else 1
    if head_dim <= 128:
        # 128 x 64 over 8 waves: the H200's 128 x 128 over 4 waves needs 96-160 KB of LDS and
        # spilled 188-1028 bytes to scratch on CDNA (tests/compile/resources.json)
        return 128, 64, 8, ns
    return 64, 32, 4, ns  # d = 256: half the rows and keys keep the accumulator in VGPRs


def _launch_config(head_dim: int, q_dtype: torch.dtype, on_gpu: bool, *,
                   short_rows: bool = False, arch: str | None = None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). short_rows: a 16-bit cache whose query
    blocks see few keys on average (see ExtendPlan): smaller blocks, twice the programs.
    arch: an AMD CDNA arch ("gfx942", "gfx950") takes its own configs for 16-bit q."""
    if not on_gpu:
        return 16, 16, 4, 1
    if arch in CDNA_ARCHS and q_dtype != torch.float32:
        return _cdna_config(arch, head_dim)
    if q_dtype == torch.float32:
        # fp32 runs IEEE dots on the FMA units: the 16-bit tiles below spilled 16-62 KB per
        # thread and took 24-48 s to compile on sm_90 (build/compile_matrix-style AOT, ptxas);
        # these tiles compile in 1-2 s with no spills. fp32 is the accuracy path, not the
        # fast one.
        return (32, 32, 4, 1) if head_dim <= 64 else (16, 32, 4, 1) if head_dim <= 128 \
            else (16, 16, 8, 1)
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        # H200 sweeps (benchmarks/RESULTS.md, "attention.extend"): 128 x 128 tiles,
        # 8 warps, 3 stages lead at 16k-token prefill and over a 16k prefix; at 4k-token
        # prefill (2k keys per query block on average) 64 x 64 tiles with 4 warps do better
        # (404 vs 364 TFLOP/s with the new tokens' K/V read contiguously)
        return (64, 64, 4, 3) if short_rows else (128, 128, 8, 3)
    return 64, 32, 4, 2


SHORT_ROWS_KEYS = 4096


def _mean_keys(counts, lens, block_m) -> float:
    """Mean number of keys a causal query block of block_m rows sees (its last row's)."""
    total = blocks = 0
    for n, L in zip(counts, lens):
        nb = -(-n // block_m)
        # block i's last query sits at position L - n + min((i + 1) * block_m, n) - 1
        total += sum(L - n + min((i + 1) * block_m, n) for i in range(nb))
        blocks += nb
    return total / blocks if blocks else 0.0


class ExtendPlan(PlanBase):
    """Per-batch work list for extend; `run` launches one grid with no host sync.

    The plan reads qo_indptr and seq_lens on the host once (a sync at plan time, not at run
    time), or takes their host copies (`host_qo_indptr`, `host_seq_lens`: no sync).
    """

    KERNEL = "attention.extend.triton"
    REPR_FIELDS = ('hq', 'group', 'd', 'page_size', 'causal', 'num_blocks', 'block_m', 'block_n', 'num_warps', 'num_stages')

    def __init__(self, qo_indptr, page_table, seq_lens, *, num_q_heads, num_kv_heads,
                 head_dim, page_size, q_dtype, kv_dtype, scale, causal=True,
                 sliding_window=None, softcap=None, config=None, host_qo_indptr=None,
                 host_seq_lens=None):
        self.qo_indptr, self.page_table, self.seq_lens = qo_indptr, page_table, seq_lens
        self.hq, self.group, self.d, self.page_size = num_q_heads, \
            num_q_heads // num_kv_heads, head_dim, page_size
        self.scale, self.causal, self.window, self.softcap = scale, causal, sliding_window, softcap
        ptr, lens = v_.host_lengths(qo_indptr, seq_lens, host_qo_indptr, host_seq_lens)
        counts, lens = np.diff(ptr).tolist(), lens.tolist()
        on_gpu = qo_indptr.device.type == "cuda"
        plat = platform_of(qo_indptr.device) if on_gpu else None
        arch = plat.arch if plat is not None and plat.vendor == "amd" else None
        short = kv_dtype.itemsize >= 2 and causal and _mean_keys(counts, lens, 128) < SHORT_ROWS_KEYS
        self.launch_options = dict(CDNA_OPTIONS) if arch in CDNA_ARCHS else {}
        self.tuned_from = None
        if config is None and on_gpu:
            # the tuned config (autotune tables), else _launch_config through the space
            choice = _tune.extend_choice(
                qo_indptr.device, head_dim=head_dim, group=self.group, q_dtype=q_dtype,
                kv_dtype=kv_dtype, causal=causal, counts=counts, lens=lens, short_rows=short,
                arch=arch)
            c = choice.config
            config = (c["block_m"], c["block_n"], c["num_warps"], c["num_stages"])
            self.launch_options.update(_tune.tuning.backend_options(c))
            self.tuned_from = choice.link
        self.block_m, self.block_n, self.num_warps, self.num_stages = config or \
            _launch_config(head_dim, q_dtype, on_gpu, arch=arch, short_rows=short)
        self.block_d = max(16, triton.next_power_of_2(head_dim))
        work = [(b, i) for b, c in enumerate(counts) for i in range(triton.cdiv(c, self.block_m))]
        # Longest work first (later query blocks of long requests see the most keys); the
        # grid walks heads fastest, so this order holds across heads: H200, 4k prefill 438 vs
        # 409 TFLOP/s with a grid that ran each head's list in turn (benchmarks/RESULTS.md,
        # "attention.extend").
        work.sort(key=lambda bi: -(lens[bi[0]] - counts[bi[0]] + (bi[1] + 1) * self.block_m))
        self.num_blocks = len(work)
        # non_blocking: a blocking upload would wait for the stream's queued work (a sync)
        self.work = torch.tensor(work or [(0, 0)], dtype=torch.int32).reshape(-1).to(
            qo_indptr.device, non_blocking=True)

    def run(self, q, k_cache, v_cache, *, sinks=None, k_scale=None, v_scale=None, out=None,
            k=None, v=None):
        """k, v: optionally the new tokens' own K/V ([T, Hkv, D], the values just stored in
        the cache): with a causal plan, a power-of-two head size and 16-byte aligned rows the
        kernel reads the new tokens' keys from them through tensor descriptors (TMA on sm_90+)
        and only the cached prefix through the page table. Same result either way."""
        o = torch.empty_like(q) if out is None else out
        contig = v_.new_kv(k, v, q.shape[0], k_cache) and self._can_read_contiguous(k, v)
        if self.num_blocks == 0:
            return o
        scaled = k_scale is not None
        dummy = self.seq_lens
        if contig:
            _ensure_allocator()
        else:
            k = v = q
        _extend_kernel[(self.hq * self.num_blocks,)](
            q, k_cache, v_cache, k, v, self.qo_indptr, self.page_table, self.seq_lens,
            self.work, k_scale if scaled else dummy, v_scale if scaled else dummy,
            sinks if sinks is not None else dummy, o, self.scale,
            float(self.softcap or 1.0), int(self.window or 0), q.shape[0], q.stride(0),
            q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), k.stride(0), v.stride(0),
            self.page_table.stride(0), o.stride(0), o.stride(1), G=self.group,
            HKV=k_cache.shape[2], D=self.d, BLOCK_D=self.block_d, PAGE=self.page_size,
            BLOCK_M=self.block_m, BLOCK_N=self.block_n, CAUSAL=self.causal, SCALED=scaled,
            PER_HEAD=scaled and k_scale.numel() > 1, SOFTCAP=bool(self.softcap),
            WINDOW=bool(self.window), SINKS=sinks is not None, IEEE=q.dtype == torch.float32,
            CONTIG=contig, num_warps=self.num_warps, num_stages=self.num_stages,
            **self.launch_options)
        return o

    def _can_read_contiguous(self, k, v) -> bool:
        size = k.element_size()
        return (self.causal and self.block_d == self.d
                and all(t.data_ptr() % 16 == 0 and t.stride(0) * size % 16 == 0
                        for t in (k, v)))


def _ensure_allocator():
    """Tensor descriptors built inside a kernel need a small global scratch from Triton's
    allocator hook (a context variable: set per thread, only where none is set)."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=dev)


def _cases():
    # strides: multiples of 16 at run time (the JIT specialises them)
    strides = ("q_st", "q_sh", "k_sp", "k_ss", "k_sh", "v_sp", "v_ss", "v_sh", "kn_st", "vn_st",
               "pt_sb", "o_st", "o_sh")

    def signature(q_t, kv_t):
        sig = {"q_ptr": q_t, "k_ptr": kv_t, "v_ptr": kv_t, "kn_ptr": q_t, "vn_ptr": q_t,
               "qo_ptr": "*i32", "pt_ptr": "*i32", "lens_ptr": "*i32", "work_ptr": "*i32",
               "ks_ptr": "*fp32", "vs_ptr": "*fp32", "sink_ptr": "*fp32", "o_ptr": q_t,
               "sm_scale": "fp32", "softcap": "fp32", "window": "i32", "num_rows": "i32"}
        sig.update({k: "i32" for k in strides})
        return sig

    base = dict(G=4, HKV=8, D=128, BLOCK_D=128, PAGE=16, CAUSAL=True, PER_HEAD=False)
    out = []
    bm, bn, nw, ns = _launch_config(128, torch.bfloat16, True)
    for kv_t in ("*bf16", "*fp8e4nv"):
        fp8 = kv_t != "*bf16"
        c = dict(base, BLOCK_M=bm, BLOCK_N=bn, SCALED=fp8, SOFTCAP=fp8, WINDOW=fp8, SINKS=fp8,
                 IEEE=False)
        out.append(CompileCase(_extend_kernel, signature("*bf16", kv_t), c, num_warps=nw,
                               num_stages=ns, uses_dot=True, label=kv_t[1:], aligned=strides))
    # 16-bit cache with the new tokens' K/V read contiguously (tensor descriptors: TMA on sm_90+)
    c = dict(base, BLOCK_M=bm, BLOCK_N=bn, SCALED=False, SOFTCAP=False, WINDOW=False,
             SINKS=False, IEEE=False, CONTIG=True)
    out.append(CompileCase(_extend_kernel, signature("*bf16", "*bf16"), c, num_warps=nw,
                           num_stages=ns, uses_dot=True, label="bf16_contig", aligned=strides))
    bm, bn, nw, ns = _launch_config(128, torch.bfloat16, True, short_rows=True)
    c = dict(c, BLOCK_M=bm, BLOCK_N=bn)
    out.append(CompileCase(_extend_kernel, signature("*bf16", "*bf16"), c, num_warps=nw,
                           num_stages=ns, uses_dot=True, label="bf16_contig_short",
                           aligned=strides))
    # the fp32 accuracy path with its GPU tiles (d=128): IEEE dots run on the FMA units, so no
    # matrix instruction is expected; the matrix records its registers and spills
    bm, bn, nw, ns = _launch_config(128, torch.float32, True)
    c = dict(base, BLOCK_M=bm, BLOCK_N=bn, SCALED=False, SOFTCAP=True, WINDOW=False, SINKS=True,
             IEEE=True)
    out.append(CompileCase(_extend_kernel, signature("*fp32", "*fp32"), c, num_warps=nw,
                           num_stages=ns, uses_dot=False, label="fp32_ieee", aligned=strides))
    # the 16-bit cases above are the NVIDIA configs; CDNA builds its own (_cdna_config)
    nvidia = tuple(t for t in TRITON["compiled"] if t.startswith("sm_"))
    out = [dataclasses.replace(x, targets=nvidia) if x.uses_dot else x for x in out]
    for arch in CDNA_ARCHS:
        bm, bn, nw, ns = _cdna_config(arch, 128)
        for x in [x for x in out if x.targets == nvidia and x.label != "bf16_contig_short"]:
            c = dict(x.constexprs, BLOCK_M=bm, BLOCK_N=bn)
            out.append(dataclasses.replace(x, constexprs=c, num_warps=nw, num_stages=ns,
                                           targets=(arch,), label=f"{x.label}_{arch}",
                                           options=tuple(CDNA_OPTIONS.items())))
    return out


register("attention", "extend", **TRITON, formats={"q": ("fp32", "fp16", "bf16"),
                                                   "kv": KV_FORMATS},
         traits={"head_dim": lambda d: 16 <= d <= 256, "page_size": lambda p: 1 <= p <= 256,
                 "gqa": lambda g: 1 <= g <= 64},
         tags=("deterministic", "throughput"), compile_cases=_cases, plan=ExtendPlan,
         description="Triton paged causal extend / prefill (plan once per batch, run per layer).")
