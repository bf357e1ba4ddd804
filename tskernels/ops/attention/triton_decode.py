"""Triton paged decode attention: GQA-grouped, split-KV, with a plan/run split.

Math (per request b, query head h, KV head kv = h // G, visible keys j in [lo, L)):
    s_j = scale * k_scale[kv] * (q_h . K_j)      (fp8 cache: K_j dequantized by its scale)
    s_j = c * tanh(s_j / c)                      if softcap c
    o_h = v_scale[kv] * sum_j exp(s_j) V_j / (sum_j exp(s_j) + exp(sink_h))
with L = seq_lens[b], lo = max(0, L - W) for a sliding window W, else 0.

One program owns (split, KV head, request) and all G query heads of that KV head, so every KV
page is read from memory once per KV head: the G heads form the M side of a [G x D] @ [D x N]
dot (padded to 16 rows, the smallest tensor-core tile; decode is memory-bound, the wasted rows
cost nothing measurable). Key positions are mapped to (page, slot) per token, so any page size
works and a block of keys may straddle pages.

Split-KV: `DecodePlan` fixes num_splits per batch (enough programs to fill the GPU); each split
takes an equal, BLOCK_N-aligned share of the visible keys, computed on the device from
seq_lens, so a captured CUDA graph stays correct when the lengths change between replays.
With one split the kernel finalises directly; otherwise it writes (o, lse) partials into the
plan's workspace and `_merge_kernel` combines them with the sink. `DecodePlan.run` does no host
synchronisation and allocates nothing when given `out`.
"""
from __future__ import annotations

import torch
import triton
from autotune import default_store, device_key, pow2_bucket
import triton.language as tl

from ...compile import CompileCase
from ...platform import platform_of
from ...registry import register
from .._common import TRITON

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
KV_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3:per_tensor", "fp8_e4m3:per_head")
MAX_SPLITS = 64
FUSED_MERGE_MAX_SPLITS = 2


@triton.jit
def _tanh(x):
    # Overflow-safe tanh from exp2 (portable: no libdevice), odd-symmetric.
    e = tl.exp2(-2.0 * LOG2E * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _fp8_to_f16(x):
    # e4m3 -> fp16, 4 values per instruction pair. Marked impure so the layout passes cannot
    # sink it below the shared-memory stage: fp16 (not fp8) reaches shared memory and the PV
    # dot's transposed B operand comes from ldmatrix.trans instead of byte-wise shared loads
    # (sm_90 has no 8-bit ldmatrix.trans). NVIDIA only (PTX); not in the interpreter.
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
        "cvt.rn.f16x2.e4m3x2 $1, hi; }", "=r,=r,r", [x.to(tl.int8, bitcast=True)],
        dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _kv_scales(ks_ptr, vs_ptr, kvh, sm_scale, SCALED: tl.constexpr, PER_HEAD: tl.constexpr):
    """(softmax scale with K's dequant scale folded in, V's dequant scale) for KV head kvh."""
    qk_scale = sm_scale
    v_scale = 1.0
    if SCALED:
        if PER_HEAD:
            qk_scale *= tl.load(ks_ptr + kvh)
            v_scale = tl.load(vs_ptr + kvh)
        else:
            qk_scale *= tl.load(ks_ptr)
            v_scale = tl.load(vs_ptr)
    return qk_scale, v_scale


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, pt_ptr, lens_ptr, ks_ptr, vs_ptr, sink_ptr,
                   o_ptr, po_ptr, plse_ptr, sem_ptr, sm_scale, softcap, window, num_splits,
                   q_sb, q_sh, k_sp, k_ss, k_sh, v_sp, v_ss, v_sh, pt_sb, o_sb, o_sh,
                   G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, SCALED: tl.constexpr, PER_HEAD: tl.constexpr,
                   SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, SINKS: tl.constexpr,
                   IEEE: tl.constexpr, FP8_ASM: tl.constexpr = False,
                   FUSED_MERGE: tl.constexpr = False, BLOCK_S: tl.constexpr = 2):
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
    qk_scale, v_scale = _kv_scales(ks_ptr, vs_ptr, kvh, sm_scale, SCALED, PER_HEAD)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    pt_row = pt_ptr + b * pt_sb
    k_base = k_ptr + kvh * k_sh
    v_base = v_ptr + kvh * v_sh
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tm = t < end
        page = tl.load(pt_row + t // PAGE, mask=tm, other=0).to(tl.int64)
        slot = t % PAGE
        km = tm[:, None] & dm[None, :]
        k = tl.load(k_base + (page * k_sp + slot * k_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
        v = tl.load(v_base + (page * v_sp + slot * v_ss)[:, None] + d[None, :], mask=km,
                    other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee")
        elif FP8_ASM:
            s = tl.dot(q, tl.trans(_fp8_to_f16(k)))
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
        s = s * qk_scale
        if SOFTCAP:
            s = softcap * _tanh(s / softcap)
        s = tl.where(tm[None, :], s * LOG2E, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        elif FP8_ASM:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), _fp8_to_f16(v))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new

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
                _merge_group(po_ptr, plse_ptr, sink_ptr, o_ptr, b, kvh * G, num_splits,
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


@triton.jit
def _merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, rows, sm, d, o_sb, o_sh,
                D: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr,
                BYPASS_L1: tl.constexpr):
    """o[b, h] = sum_s exp(lse_s - M) o_s / (sum_s exp(lse_s - M) + exp(sink - M)) over the
    partial rows `rows` (mask sm). BYPASS_L1: read them with .cg (written by other CTAs of
    the running kernel)."""
    if BYPASS_L1:
        lse = tl.load(plse_ptr + rows, mask=sm, other=float("-inf"), cache_modifier=".cg")
        po = tl.load(po_ptr + rows[:, None] * BLOCK_D + d[None, :], mask=sm[:, None],
                     other=0.0, cache_modifier=".cg")
    else:
        lse = tl.load(plse_ptr + rows, mask=sm, other=float("-inf"))
        po = tl.load(po_ptr + rows[:, None] * BLOCK_D + d[None, :], mask=sm[:, None],
                     other=0.0)
    m = tl.max(lse, 0)
    if SINKS:
        sink = tl.load(sink_ptr + h)
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)
    den = tl.sum(w, 0)
    if SINKS:
        den += tl.exp(sink - m)
    o = tl.sum(po * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * o_sb + h * o_sh + d, o.to(o_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def _merge_group(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h0, num_splits, row_stride,
                 o_sb, o_sh, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_S: tl.constexpr, SINKS: tl.constexpr):
    """Merge the num_splits partials of query heads h0 .. h0 + G - 1 into o, one head at a
    time, each from one [splits x D] load (rows (b * H + h) * num_splits + s)."""
    sidx = tl.arange(0, BLOCK_S)
    sm = sidx < num_splits
    d = tl.arange(0, BLOCK_D)
    for g in range(G):
        h = h0 + g
        rows = (b * row_stride + h) * num_splits + sidx
        _merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, rows, sm, d, o_sb, o_sh, D,
                    BLOCK_D, SINKS, True)


@triton.jit
def _merge_kernel(po_ptr, plse_ptr, sink_ptr, o_ptr, num_splits, H, o_sb, o_sh,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                  SINKS: tl.constexpr):
    """One (head, request) per program: merge its split-KV partials (see _merge_head)."""
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    sidx = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    sm = sidx < num_splits
    row = (b * H + h) * num_splits + sidx
    _merge_head(po_ptr, plse_ptr, sink_ptr, o_ptr, b, h, row, sm, d, o_sb, o_sh, D, BLOCK_D,
                SINKS, False)


def choose_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                  block_n: int, min_chunk: int = 128) -> int:
    """Enough (request, KV head, split) programs for ~2 per SM, each with >= min_chunk keys
    (H200 sweep: B=1 L=4k best at 32 splits, B=16 L=4k at 3-6, B>=64 at 1)."""
    base = max(1, batch * num_kv_heads)
    want = triton.cdiv(2 * max(num_sms, 1), base)
    cap = max(1, triton.cdiv(max(max_seq_len, 1), max(min_chunk, block_n)))
    return int(max(1, min(want, cap, MAX_SPLITS)))


def _launch_config(head_dim: int, kv_dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) per head dim: ~32 KB of K+V per pipeline stage."""
    block_d = triton.next_power_of_2(head_dim)
    block_n = max(16, min(128, 8192 // block_d)) if kv_dtype.itemsize == 1 \
        else max(16, min(64, 8192 // block_d))
    return block_n, 4, 3


TUNE_KERNEL = "attention.decode.triton"


def tune_key(head_dim: int, kv: str, group: int, batch_x_kv_heads: int, max_seq_len: int) -> str:
    """The autotune problem key of a decode batch: power-of-two buckets of the program count
    and the longest sequence, so nearby batches share a tuned entry."""
    return (f"d{head_dim}-{kv}-g{group}-bh{pow2_bucket(batch_x_kv_heads)}"
            f"-L{pow2_bucket(max_seq_len)}")


def _tuned(device, head_dim, kv_dtype, group, batch_x_kv_heads, max_seq_len) -> dict | None:
    """A shipped/user-tuned config for this bucket on this device, if one was measured."""
    if device.type != "cuda":
        return None
    kv = "fp8" if kv_dtype.itemsize == 1 else "bf16"
    return default_store().get(TUNE_KERNEL, device_key(device),
                               tune_key(head_dim, kv, group, batch_x_kv_heads, max_seq_len))


class DecodePlan:
    """Per-batch decode metadata and workspace; `run` is CUDA-graph capturable.

    Build once per batch (`attention.decode_plan`), reuse for every layer. page_table and
    seq_lens are held by reference: update their contents in place between graph replays.
    """

    def __init__(self, page_table, seq_lens, *, num_q_heads, num_kv_heads, head_dim,
                 page_size, q_dtype, kv_dtype, scale, sliding_window=None, softcap=None,
                 max_seq_len=None, num_splits=None, block_n=None, num_warps=None,
                 num_stages=None):
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
        tuned = _tuned(dev, head_dim, kv_dtype, self.group, self.batch * num_kv_heads,
                       max_seq_len) or {}
        bn, nw, ns = _launch_config(head_dim, kv_dtype)
        self.block_n = block_n or tuned.get("block_n", bn)
        self.num_warps = num_warps or tuned.get("num_warps", nw)
        self.num_stages = num_stages or tuned.get("num_stages", ns)
        num_splits = num_splits or tuned.get("num_splits")
        self.block_d = max(16, triton.next_power_of_2(head_dim))
        self.fp8_asm = kv_dtype == torch.float8_e4m3fn and page_table.device.type == "cuda" \
            and torch.version.hip is None
        self.block_g = max(16, triton.next_power_of_2(self.group))
        sms = platform_of(dev).num_sms if dev.type == "cuda" else 4
        self.num_splits = num_splits or choose_splits(self.batch, num_kv_heads, max_seq_len,
                                                      sms, self.block_n)
        n = self.batch * num_q_heads * self.num_splits
        # split-KV partials merged by the last split program of each (request, KV head)
        # (counted on a per-plan semaphore) instead of a second launch, only when the splits
        # are very few. H200, graph replay (results/h200/attention_decode_merge_policy.json):
        # equal at 2 splits (B=16: 85.6 vs 86.2 µs), behind at 4-32 (B=16 4 splits 75.2 vs
        # 71.3, B=1 32 splits 17.9 vs 15.4): the merging program is a serial tail that costs
        # more than the launch it saves; eagerly it saves a ~30 µs launch (B=16 4 splits:
        # 70.8 vs 87.4 µs, attention_decode*_session3.json). Not chosen per call (eager vs
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
            BLOCK_S=max(2, triton.next_power_of_2(self.num_splits)),
            num_warps=self.num_warps,
            num_stages=self.num_stages)
        if split and not self.fused_merge:
            _merge_kernel[(self.hq, B)](
                self.partial_o, self.partial_lse, sinks if sinks is not None else dummy, o,
                self.num_splits, self.hq, o.stride(0), o.stride(1), D=self.d,
                BLOCK_D=self.block_d, BLOCK_S=max(2, triton.next_power_of_2(self.num_splits)),
                SINKS=sinks is not None, num_warps=1)
        return o


def make_plan(page_table, seq_lens, **kw) -> DecodePlan:
    return DecodePlan(page_table, seq_lens, **kw)


def _cases():
    out = []
    for kv_t, scaled, per_head in (("*bf16", False, False), ("*fp8e4nv", True, True)):
        sig = {"q_ptr": "*bf16", "k_ptr": kv_t, "v_ptr": kv_t, "pt_ptr": "*i32",
               "lens_ptr": "*i32", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "sink_ptr": "*fp32",
               "o_ptr": "*bf16", "po_ptr": "*fp32", "plse_ptr": "*fp32", "sem_ptr": "*i32",
               "sm_scale": "fp32",
               "softcap": "fp32", "window": "i32", "num_splits": "i32"}
        strides = ("q_sb", "q_sh", "k_sp", "k_ss", "k_sh", "v_sp", "v_ss", "v_sh", "pt_sb",
                   "o_sb", "o_sh")  # multiples of 16 at run time (the JIT specialises them)
        sig.update({k: "i32" for k in strides})
        for split in (False, True):
            c = dict(G=4, BLOCK_G=16, D=128, BLOCK_D=128, PAGE=16, BLOCK_N=64, SPLIT=split,
                     SCALED=scaled, PER_HEAD=per_head, SOFTCAP=split, WINDOW=split,
                     SINKS=not split, IEEE=False, FUSED_MERGE=split, BLOCK_S=4 if split else 2)
            # uses_dot=False: the [16 x D] tile is below wgmma's M=64, so sm_90/sm_100 lower
            # the dot to mma.sync (not the wgmma/tcgen05 the matrix check looks for).
            out.append(CompileCase(_decode_kernel, sig, c, uses_dot=False, num_stages=3,
                                   label=f"{kv_t[1:]}{'_split' if split else ''}",
                                   aligned=strides))
    msig = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "sink_ptr": "*fp32", "o_ptr": "*bf16",
            "num_splits": "i32", "H": "i32", "o_sb": "i32", "o_sh": "i32"}
    out.append(CompileCase(_merge_kernel, msig, dict(D=128, BLOCK_D=128, BLOCK_S=16,
                                                     SINKS=True), num_warps=1, label="merge"))
    return out


def _decode_traits():
    return {"head_dim": lambda d: 16 <= d <= 256, "page_size": lambda p: 1 <= p <= 256,
            "gqa": lambda g: 1 <= g <= 64}


@register("attention", "decode", **TRITON, formats={"q": ("fp32", "fp16", "bf16"),
                                                    "kv": KV_FORMATS},
          traits=_decode_traits(), tags=("deterministic", "latency", "throughput"),
          compile_cases=_cases)
def decode(q, k_cache, v_cache, page_table, seq_lens, *, scale, sliding_window=None,
           softcap=None, sinks=None, k_scale=None, v_scale=None):
    """Triton paged GQA decode, split-KV planned per call (use decode_plan to reuse)."""
    plan = DecodePlan(page_table, seq_lens, num_q_heads=q.shape[1],
                      num_kv_heads=k_cache.shape[2], head_dim=q.shape[2],
                      page_size=k_cache.shape[1], q_dtype=q.dtype, kv_dtype=k_cache.dtype,
                      scale=scale, sliding_window=sliding_window, softcap=softcap)
    return plan.run(q, k_cache, v_cache, sinks=sinks, k_scale=k_scale, v_scale=v_scale)


decode.make_plan = make_plan
