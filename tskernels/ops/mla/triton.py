"""Triton absorbed-MLA attention over a paged latent cache: decode and extend in one kernel.

Math (tskernels_ref.mla): row i of the cache is [c_kv (DC = kv_lora_rank) | k_rope (DR)];
    s_j = scale * kv_scale * (q . row_j)        over all DC + DR values
    o   = kv_scale * softmax(s) @ rows[:, :DC]
All heads share the one latent "KV head", so a program takes BLOCK_R (token, head) rows of one
request (decode: the heads of its single token; extend: token-major rows, causal per row) and
streams the request's latent rows once for all of them: the [BLOCK_R x 576] @ [576 x BLOCK_N]
logits and the [BLOCK_R x BLOCK_N] @ [BLOCK_N x 512] update are tensor-core dots. Split-KV
partials are combined by the attention family's merge kernel (rows = (token, head)).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from autotune import backend_options

from ...compile import CompileCase
from ...platform import platform_of
from ...plan import PlanBase
from ...registry import register
from .._common import TRITON
from . import _tune
from ..shared.split_kv import merge_block_d, merge_kernel
from ..shared.triton_math import LN2, LOG2E, fp8_to_f16


@triton.jit
def _mla_kernel(q_ptr, kv_ptr, qo_ptr, pt_ptr, lens_ptr, kvs_ptr, o_ptr, po_ptr, plse_ptr,
                sm_scale, num_splits, H, q_st, q_sh, kv_sp, kv_ss, pt_sb, o_st, o_sh,
                DC: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                SCALED: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                FP8_ASM: tl.constexpr = False):
    split = tl.program_id(0)
    rb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    q_start = tl.load(qo_ptr + b)
    n = tl.load(qo_ptr + b + 1) - q_start
    if rb * BLOCK_R >= n * H:
        return
    L = tl.load(lens_ptr + b)
    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < n * H
    tok = r // H
    h = r % H
    pos = L - n + tok
    hi = L
    if CAUSAL:
        hi = L - n + tl.minimum((rb * BLOCK_R + BLOCK_R - 1) // H, n - 1) + 1
    chunk = tl.cdiv(tl.cdiv(hi, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, hi)

    dc = tl.arange(0, DC)
    dr = tl.arange(0, DR)
    qrow = (q_start + tok).to(tl.int64) * q_st + h * q_sh
    qc = tl.load(q_ptr + qrow[:, None] + dc[None, :], mask=rm[:, None], other=0.0)
    qr = tl.load(q_ptr + qrow[:, None] + DC + dr[None, :], mask=rm[:, None], other=0.0)
    if FP8_ASM:
        # fp8 latents: e4m3 -> fp16 is one PTX cvt per pair (to bf16 it takes two steps and
        # Triton's generic cast is slower still), so both dots run in fp16; e4m3 values are
        # exact in fp16, q is rounded to fp16 (finer than bf16; |q| < 65504 assumed)
        qc = qc.to(tl.float16)
        qr = qr.to(tl.float16)
    qk_scale = sm_scale * LOG2E
    v_scale = 1.0
    if SCALED:
        v_scale = tl.load(kvs_ptr)
        qk_scale *= v_scale

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, DC], tl.float32)
    pt_row = pt_ptr + b * pt_sb
    for t0 in range(start, end, BLOCK_N):
        j = t0 + tl.arange(0, BLOCK_N)
        jm = j < end
        page = tl.load(pt_row + j // PAGE, mask=jm, other=0).to(tl.int64)
        base = page * kv_sp + (j % PAGE) * kv_ss
        kc = tl.load(kv_ptr + base[:, None] + dc[None, :], mask=jm[:, None], other=0.0)
        kr = tl.load(kv_ptr + base[:, None] + DC + dr[None, :], mask=jm[:, None], other=0.0)
        if FP8_ASM:
            kc = fp8_to_f16(kc)
            kr = fp8_to_f16(kr)
        else:
            kc = kc.to(qc.dtype)
        if IEEE:
            s = tl.dot(qc, tl.trans(kc), input_precision="ieee")
            s = tl.dot(qr, tl.trans(kr.to(qr.dtype)), s, input_precision="ieee")
        else:
            s = tl.dot(qc, tl.trans(kc))
            s = tl.dot(qr, tl.trans(kr.to(qr.dtype)), s)
        ok = jm[None, :]
        if CAUSAL:
            ok = ok & (j[None, :] <= pos[:, None])
        s = tl.where(ok, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, kc, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc)
        m_i = m_new

    acc = acc * v_scale
    has = l_i > 0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    t = (q_start + tok).to(tl.int64)
    if SPLIT:
        row = (t * H + h) * num_splits + split
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * LN2, float("-inf"))
        tl.store(po_ptr + row[:, None] * DC + dc[None, :], o, mask=rm[:, None])
        tl.store(plse_ptr + row, lse, mask=rm)
    else:
        tl.store(o_ptr + t[:, None] * o_st + h[:, None] * o_sh + dc[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=rm[:, None])


# AMD CDNA (wave 64): heuristic launch configs per arch. No AMD GPU ran them; the compile matrix
# shows MFMA, no scratch and LDS within the arch for each. The NVIDIA 64-row form (8 warps,
# 64-key tiles, 2 stages) spilled 1.1-2.7 KB to scratch there and needed 80 KB of LDS.
CDNA_ARCHS = ("gfx942", "gfx950")
# 16x16 MFMA: the 16-row form is one MFMA row block, and 32x32 tiles spilled (256 B, gfx942);
# waves_per_eu unset: these tiles take 330-510 VGPRs (one wave per SIMD), and a cap of 256
# (waves_per_eu=2) spilled
CDNA_OPTIONS = {"matrix_instr_nonkdim": 16}


def cdna_config(arch: str, num_heads: int) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_N, num_warps, num_stages) of the 16-bit / fp8 latents on gfx942 / gfx950."""
    # 4 waves, not 8: the [rows x 512] accumulator and q tile are replicated per wave along
    # N, so 8 waves are capped at 256 VGPRs and spilled (224-952 B) where 4 waves fit in 512
    # 32-key tiles: 64-key tiles spilled at 2 stages (272-1376 B)
    if arch == "gfx950":
        # 160 KB LDS: 2 stages; 32 rows at most (64 fp8 rows spilled 580 B with gfx950's
        # native e4m3 conversions)
        return min(32, max(16, triton.next_power_of_2(num_heads))), 32, 4, 2
    # gfx942, 64 KB LDS: one stage (two spilled 24-324 B); 64 rows use all 64 KB, and halve
    # the latent reads of 32-row blocks at 128 heads
    return min(64, max(16, triton.next_power_of_2(num_heads))), 32, 4, 1


class MLAPlan(PlanBase):
    """Per-batch MLA metadata and workspace (decode: qo_indptr = arange(B + 1); q_dtype is
    accepted for the plan interface and not needed: the kernel specialises on q at launch).

    The new-token counts come from `host_qo_indptr` (mla.extend_plan passes the caller's host
    copy: no device read), else from qo_indptr read once here (a sync on a GPU; the decode plan
    knows them: one token each). `run` neither syncs nor allocates (given `out`).
    """

    KERNEL = "mla.triton"
    REPR_FIELDS = ('batch', 'H', 'dc', 'dr', 'page_size', 'causal', 'num_splits', 'block_r', 'block_n', 'num_warps', 'num_stages', 'fp8_asm')

    def __init__(self, qo_indptr, page_table, seq_lens, *, num_heads, kv_lora_rank, rope_dim,
                 page_size, scale, causal, max_seq_len=None, num_splits=None, block_r=None,
                 block_n=None, num_warps=None, num_stages=None, max_new_tokens=None,
                 fp8_asm=None, kv_dtype=None, q_dtype=None, waves_per_eu=None,
                 matrix_instr_nonkdim=None, host_qo_indptr=None, host_seq_lens=None):
        self.qo_indptr, self.page_table, self.seq_lens = qo_indptr, page_table, seq_lens
        B = page_table.shape[0]
        host_ptr = None  # (host_seq_lens: not needed, the kernel reads seq_lens on the device)
        if max_new_tokens is None:
            host_ptr = (np.asarray(host_qo_indptr, dtype=np.int64).reshape(-1)
                        if host_qo_indptr is not None
                        else qo_indptr.cpu().numpy().astype(np.int64))
            max_new_tokens = int(np.diff(host_ptr).max()) if B else 0
        self.H, self.dc, self.dr, self.page_size = num_heads, kv_lora_rank, rope_dim, page_size
        self.scale, self.causal = scale, causal
        self.tuned_from = None
        dev = page_table.device
        gpu = dev.type == "cuda"
        self.block_r = block_r or (min(64, max(16, triton.next_power_of_2(num_heads))) if gpu
                                   else 16)
        fp8 = kv_dtype == torch.float8_e4m3fn
        nvidia = gpu and torch.version.hip is None
        cc = torch.cuda.get_device_capability(dev) if nvidia else (0, 0)
        # Launch configs from the H200 sweeps (benchmarks/RESULTS.md, "mla.decode"). Up to 16
        # heads the rows are one 16-row mma.sync and the kernel is bound by the latent reads:
        # 16-bit latents stream 128-key tiles with 8 warps (B=64, L=4k: 111 vs 137 us with the
        # 64-key default), fp8 latents 32-key tiles with 4 warps, 3 stages, converted by PTX
        # (122 us; Triton's cast at the former config: 239). More heads: 64-key tiles, 8 warps
        # (the [rows x 512] accumulator).
        small = nvidia and self.block_r <= 16  # measured on NVIDIA only
        bn, nw, ns = ((32, 4, 3) if fp8 else (128, 8, 2)) if small else (64, 8, 2)
        plat = platform_of(dev) if gpu and not nvidia else None
        arch = plat.arch if plat is not None and plat.vendor == "amd" else None
        self.launch_options = {}
        if arch in CDNA_ARCHS:
            br, bn, nw, ns = cdna_config(arch, num_heads)
            self.block_r = block_r or br
            self.launch_options = dict(CDNA_OPTIONS)
        if gpu and block_r is None and any(d is not None and d.itemsize == 4
                                           for d in (q_dtype, kv_dtype)):
            # fp32 (a correctness mode): a 64-row [rows x 576] fp32 Q tile plus 64-key fp32
            # stages need ~311 KB of shared memory (the H200 conformance tier hit it); 16 rows,
            # 32-key tiles and one stage fit (~110 KB). Not yet timed or run on the GPU.
            self.block_r, bn, nw, ns = 16, 32, 4, 1
        elif gpu and all(x is None for x in (block_r, block_n, num_warps, num_stages,
                                             num_splits)):
            # the tuned config (autotune tables), else the choices above through the space
            ch = _tune.choice(
                max_new_tokens == 1 and not causal, dev, heads=num_heads, kv_dtype=kv_dtype,
                batch=B, max_seq_len=max_seq_len or page_table.shape[1] * page_size,
                new_tokens=max(1, max_new_tokens), nvidia=nvidia)
            if arch not in CDNA_ARCHS or ch.link != "heuristic":  # (CDNA: its own configs)
                bn, nw, ns = ch.config["block_n"], ch.config["num_warps"], \
                    ch.config["num_stages"]
                num_splits = ch.config["num_splits"] or None
            if arch in CDNA_ARCHS:  # the entry's AMD knobs (the space's defaults otherwise)
                self.launch_options.update(backend_options(ch.config))
            self.tuned_from = ch.link
        if arch in CDNA_ARCHS:  # explicit knobs (the tuner's candidates) win
            self.launch_options.update({k: v for k, v in (
                ("waves_per_eu", waves_per_eu), ("matrix_instr_nonkdim", matrix_instr_nonkdim))
                if v is not None})
        self.block_n = block_n or (bn if gpu else 16)
        self.num_warps = num_warps or (nw if gpu else 4)
        self.num_stages = num_stages or (ns if gpu else 1)
        # fp8 latents only, and only in the 16-row form (with 64 rows the extra fp16 tile
        # spills: 559 vs 503 us at 128 heads); sm_100's software pipeliner rejects the asm
        # (a plan made without kv_dtype never uses it: its launch config is the 16-bit one,
        # whose shared memory the converted fp8 tile would overflow)
        self.fp8_asm = fp8_asm if fp8_asm is not None else \
            fp8 and cc >= (8, 9) and cc[0] != 10 and self.block_r <= 16
        self.row_blocks = max(1, triton.cdiv(max_new_tokens * num_heads, self.block_r))
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * page_size
        sms = platform_of(dev).num_sms if gpu else 4
        if num_splits is None:
            base = max(1, B * self.row_blocks)
            # about two programs per SM; the 16-row configs round down so the last wave is
            # not a sliver (one or two programs fit per SM: B=64 -> 4 splits, 111 vs 131 us
            # at 5)
            per = 2 * sms // base if small else triton.cdiv(2 * sms, base)
            num_splits = max(1, min(per, triton.cdiv(max(max_seq_len, 1), 256), 64))
        self.num_splits = num_splits
        self.batch = B
        if num_splits > 1:
            if max_new_tokens == 1:
                T = B
            elif host_ptr is not None:
                T = int(host_ptr[-1])
            else:  # (a caller-given max_new_tokens: the tuner's runner)
                T = int(qo_indptr[-1])
            self.partial_o = torch.empty(T * num_heads * num_splits, kv_lora_rank,
                                         dtype=torch.float32, device=dev)
            self.partial_lse = torch.empty(T * num_heads * num_splits, dtype=torch.float32,
                                           device=dev)
            self.num_tokens = T

    def run(self, q, kv_cache, *, kv_scale=None, out=None):
        """q [T, H, DC + DR] -> o [T, H, DC] (into `out` when given)."""
        T = q.shape[0]
        o = out if out is not None else q.new_empty(T, self.H, self.dc)
        if self.batch == 0 or T == 0:
            return o
        split = self.num_splits > 1
        dummy = self.seq_lens
        _mla_kernel[(self.num_splits, self.row_blocks, self.batch)](
            q, kv_cache, self.qo_indptr, self.page_table, self.seq_lens,
            kv_scale if kv_scale is not None else dummy, o,
            self.partial_o if split else o, self.partial_lse if split else dummy,
            self.scale, self.num_splits, self.H, q.stride(0), q.stride(1),
            kv_cache.stride(0), kv_cache.stride(1), self.page_table.stride(0), o.stride(0),
            o.stride(1), DC=self.dc, DR=self.dr, PAGE=self.page_size, BLOCK_R=self.block_r,
            BLOCK_N=self.block_n, SPLIT=split, SCALED=kv_scale is not None,
            CAUSAL=self.causal, IEEE=q.dtype == torch.float32,
            FP8_ASM=self.fp8_asm and kv_cache.dtype == torch.float8_e4m3fn
            and q.dtype != torch.float32, num_warps=self.num_warps,
            num_stages=self.num_stages, **self.launch_options)
        if split:
            bs = max(2, triton.next_power_of_2(self.num_splits))
            bd = merge_block_d(self.dc, bs)  # (dc: a power of two)
            merge_kernel[(self.H, T, self.dc // bd)](
                self.partial_o, self.partial_lse, dummy, o, self.num_splits, self.H,
                o.stride(0), o.stride(1), D=self.dc, BLOCK_D=bd, ROW=self.dc, BLOCK_S=bs,
                SINKS=False, num_warps=4)
        return o


def _cases():
    out = []
    nvidia = tuple(t for t in TRITON["compiled"] if t.startswith("sm_"))
    for kv_t in ("*bf16", "*fp8e4nv"):
        sig = {"q_ptr": "*bf16", "kv_ptr": kv_t, "qo_ptr": "*i32", "pt_ptr": "*i32",
               "lens_ptr": "*i32", "kvs_ptr": "*fp32", "o_ptr": "*bf16", "po_ptr": "*fp32",
               "plse_ptr": "*fp32", "sm_scale": "fp32", "num_splits": "i32", "H": "i32"}
        strides = ("q_st", "q_sh", "kv_sp", "kv_ss", "pt_sb", "o_st", "o_sh")
        sig.update({k: "i32" for k in strides})  # multiples of 16 at run time (JIT-specialised)
        fp8 = kv_t != "*bf16"
        # MLAPlan's GPU launch configs: 64 rows (BLOCK_N 64, 8 warps, 2 stages) for many
        # heads; 16 rows for <= 16 heads (16-bit: BLOCK_N 128, 8 warps; fp8: BLOCK_N 32,
        # 4 warps, 3 stages, PTX conversion where the plan uses it; NVIDIA only), lowered to
        # mma.sync
        c = dict(DC=512, DR=64, PAGE=64, BLOCK_R=64, BLOCK_N=64, SPLIT=fp8, SCALED=fp8,
                 CAUSAL=fp8, IEEE=False)
        out.append(CompileCase(_mla_kernel, sig, c, num_warps=8, num_stages=2, uses_dot=True,
                               label=kv_t[1:], aligned=strides, targets=nvidia))
        # CDNA: the per-arch configs at 128 heads (the arch's row cap) and at 16 heads
        for arch, heads in ((a, h) for a in CDNA_ARCHS for h in (128, 16)):
            br, bn, nw, ns = cdna_config(arch, heads)
            cc = dict(c, BLOCK_R=br, BLOCK_N=bn) if heads > 16 else \
                dict(c, BLOCK_R=br, BLOCK_N=bn, SPLIT=True, CAUSAL=False)
            out.append(CompileCase(_mla_kernel, sig, cc, num_warps=nw, num_stages=ns,
                                   uses_dot=True, label=f"{kv_t[1:]}_{br}rows_{arch}",
                                   aligned=strides, targets=(arch,),
                                   options=tuple(CDNA_OPTIONS.items())))
        small = dict(c, BLOCK_R=16, BLOCK_N=32 if fp8 else 128, SPLIT=True, CAUSAL=False)
        nw, ns = (4, 3) if fp8 else (8, 2)
        out.append(CompileCase(_mla_kernel, sig, small, num_warps=nw, num_stages=ns,
                               uses_dot=True, narrow_dot=True, label=kv_t[1:] + "_16rows",
                               aligned=strides, targets=("sm_90", "sm_100", "sm_120")))
        if fp8:
            out.append(CompileCase(_mla_kernel, sig, dict(small, FP8_ASM=True), num_warps=nw,
                                   num_stages=ns, uses_dot=True, narrow_dot=True,
                                   label=kv_t[1:] + "_16rows_ptx", aligned=strides,
                                   targets=("sm_90", "sm_120")))
    return out


def _pow2(x):
    return x >= 16 and x & (x - 1) == 0


FORMATS = {"q": ("fp32", "fp16", "bf16"), "kv": ("fp32", "fp16", "bf16", "fp8_e4m3:per_tensor")}
TRAITS = {"kv_lora_rank": _pow2, "rope_dim": _pow2, "page_size": lambda p: 1 <= p <= 256,
          "num_heads": lambda h: 1 <= h <= 128}


register("mla", "extend", **TRITON, formats=FORMATS, traits=TRAITS,
         tags=("deterministic", "throughput"), compile_cases=_cases, plan=MLAPlan,
         description="Triton absorbed-MLA paged extend (causal per token).")


def make_decode_plan(page_table, seq_lens, **kw) -> MLAPlan:
    """Triton absorbed-MLA paged decode plan (split-KV)."""
    B = page_table.shape[0]
    indptr = torch.arange(B + 1, dtype=torch.int32, device=page_table.device)
    return MLAPlan(indptr, page_table, seq_lens, causal=False, max_new_tokens=1, **kw)


register("mla", "decode", **TRITON, formats=FORMATS, traits=TRAITS,
         tags=("deterministic", "latency", "throughput"), compile_cases=_cases,
         plan=make_decode_plan,
         description="Triton absorbed-MLA paged decode, split-KV (plan once per batch).")
