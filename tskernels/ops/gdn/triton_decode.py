"""Triton recurrent decode step of the gated delta rule, state slots updated in place.

One program per (value block, sequence x value head): it reads the slot's [K, BV] fp32 state
slice once, applies decay, delta write and readout in registers, and writes it back once, so the
step moves 2 x 4 K V bytes per (sequence, value head) and nothing else of size. The q / k L2
norm is fused (each program holds the whole key row). Slot ids come from the caller, who owns
the state pool; other slots are never touched.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from . import _tune
from ._validate import FORMATS, head_dim_ok


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slot_ptr, o_ptr, scale,
                   HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BV: tl.constexpr, L2NORM: tl.constexpr):
    iv = tl.program_id(0)
    b = tl.program_id(1) // HV
    hv = tl.program_id(1) % HV
    hk = hv // (HV // HK)
    ok = tl.arange(0, K)
    ov = iv * BV + tl.arange(0, BV)
    b64 = b.to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    q = tl.load(q_ptr + (b64 * HK + hk) * K + ok).to(tl.float32)
    k = tl.load(k_ptr + (b64 * HK + hk) * K + ok).to(tl.float32)
    if L2NORM:
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    v = tl.load(v_ptr + (b64 * HV + hv) * V + ov).to(tl.float32)
    decay = tl.exp(tl.load(g_ptr + b64 * HV + hv).to(tl.float32))
    beta = tl.load(beta_ptr + b64 * HV + hv).to(tl.float32)
    sp = state_ptr + (slot * HV + hv) * K * V + ok[:, None] * V + ov[None, :]
    s = tl.load(sp) * decay
    err = v - tl.sum(s * k[:, None], 0)
    s = s + k[:, None] * (beta * err)[None, :]
    out = tl.sum(s * q[:, None], 0) * scale
    tl.store(sp, s)
    tl.store(o_ptr + (b64 * HV + hv) * V + ov, out.to(o_ptr.dtype.element_ty))


def _block_v(batch: int, hv: int, dv: int) -> int:
    # Small batches: narrower slices give more programs (more loads in flight) for the same
    # bytes; large ones: 32 values (128-byte state rows) per program, and 64 from B x H = 2048
    # on (H200, 32 value heads: B=64 76.0 -> 72.1 us, B=256 293.8 -> 272.6 us, 88.6 / 93.7 %
    # of the copy roofline; the GPU tier ran BV = 64 at K = V = 128). Between 128 and 2048
    # nothing was measured, so 32 stays.
    # AMD CDNA keeps these blocks and 4 waves (one per SIMD): the kernel streams the fp32 state
    # (no dot, 512 B of LDS) in rows of 16-64 fp32 values, with the H200's 128 B L2 line, at
    # 52 VGPRs and no scratch (compile matrix)
    return min(dv, 16 if batch * hv <= 128 else 32 if batch * hv < 2048 else 64)


@register("gdn", "decode_step", **TRITON, formats=FORMATS,
          traits={"head_dim_k": head_dim_ok, "head_dim_v": head_dim_ok},
          tags=("deterministic", "latency"), compile_cases=lambda: _cases())
def decode_step(q, k, v, g, beta, state, state_slots, *, scale=None, use_qk_l2norm=False,
                block_v: int | None = None):
    """Triton gated delta rule decode step (one token per sequence, in-place state slots)."""
    batch, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    scale = dk ** -0.5 if scale is None else float(scale)
    o = torch.empty(batch, hv, dv, dtype=q.dtype, device=q.device)
    if batch == 0:
        return o
    if not state.is_contiguous():
        raise ValueError("state: the Triton decode step updates the pool in place and needs it "
                         f"contiguous, got strides {state.stride()}")
    tcfg = _tune.decode_config(batch, hk, hv, dk, dv, q.dtype, q.device) if block_v is None else {}
    bv = block_v or tcfg.get("block_v") or _block_v(batch, hv, dv)
    _decode_kernel[(dv // bv, batch * hv)](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state,
        state_slots.contiguous(), o, scale, HK=hk, HV=hv, K=dk, V=dv, BV=bv,
        L2NORM=use_qk_l2norm, num_warps=tcfg.get("num_warps", 4))
    return o


def _cases():
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32",
           "beta_ptr": "*bf16", "state_ptr": "*fp32", "slot_ptr": "*i32", "o_ptr": "*bf16",
           "scale": "fp32"}
    return [CompileCase(_decode_kernel, sig,
                        dict(HK=16, HV=32, K=128, V=128, BV=32, L2NORM=True), num_warps=4)]
