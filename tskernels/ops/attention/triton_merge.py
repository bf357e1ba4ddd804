"""Triton merge_states: combine two partial attention results over disjoint key sets.

    lse = log(exp(lse_a) + exp(lse_b));  o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

One program per (row, head) reads both partial rows once (memory-bound); a side with
lse = -inf contributes nothing, both -inf give o = 0 and lse = -inf.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from . import _tune


@triton.jit
def _merge_two_kernel(oa_ptr, la_ptr, ob_ptr, lb_ptr, o_ptr, lse_ptr, H, D, oa_s0, oa_s1,
                      ob_s0, ob_s1, o_s0, o_s1, l_s0, BLOCK_D: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    la = tl.load(la_ptr + n * l_s0 + h).to(tl.float32)
    lb = tl.load(lb_ptr + n * l_s0 + h).to(tl.float32)
    m = tl.maximum(la, lb)
    empty = m == float("-inf")
    m = tl.where(empty, 0.0, m)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    den = wa + wb
    inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, den))
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    oa = tl.load(oa_ptr + n * oa_s0 + h * oa_s1 + d, mask=dm, other=0.0).to(tl.float32)
    ob = tl.load(ob_ptr + n * ob_s0 + h * ob_s1 + d, mask=dm, other=0.0).to(tl.float32)
    o = (oa * (wa * inv) + ob * (wb * inv))
    tl.store(o_ptr + n * o_s0 + h * o_s1 + d, o.to(o_ptr.dtype.element_ty), mask=dm)
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, den)))
    tl.store(lse_ptr + n * H + h, lse)


def _cases():
    sig = {"oa_ptr": "*bf16", "la_ptr": "*fp32", "ob_ptr": "*bf16", "lb_ptr": "*fp32",
           "o_ptr": "*bf16", "lse_ptr": "*fp32", "H": "i32", "D": "i32", "oa_s0": "i32",
           "oa_s1": "i32", "ob_s0": "i32", "ob_s1": "i32", "o_s0": "i32", "o_s1": "i32",
           "l_s0": "i32"}
    return [CompileCase(_merge_two_kernel, sig, {"BLOCK_D": 128}, num_warps=1)]


@register("attention", "merge_states", **TRITON, formats={"o": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_cases)
def merge_states(o_a, lse_a, o_b, lse_b):
    """Triton merge of two partial attention states (one pass over both)."""
    return _merge(o_a, lse_a, o_b, lse_b)


def _merge(o_a, lse_a, o_b, lse_b, cfg: dict | None = None):
    """cfg: the launch config ({"num_warps"}); None: the tuned one on CUDA (autotune)."""
    N, H, D = o_a.shape
    o = torch.empty_like(o_a)
    lse = torch.empty(N, H, dtype=torch.float32, device=o_a.device)
    if N == 0 or H == 0:
        return o, lse.to(lse_a.dtype)
    if cfg is None:
        cfg = _tune.merge_config(N, H, D, o_a.dtype, o_a.device) \
            if o_a.device.type == "cuda" else {"num_warps": 1}
    la, lb = lse_a.contiguous(), lse_b.contiguous()
    if o_a.stride(-1) != 1 or o_b.stride(-1) != 1:
        o_a, o_b = o_a.contiguous(), o_b.contiguous()
    _merge_two_kernel[(N, H)](
        o_a, la, o_b, lb, o, lse, H, D, o_a.stride(0), o_a.stride(1), o_b.stride(0),
        o_b.stride(1), o.stride(0), o.stride(1), la.stride(0),
        BLOCK_D=triton.next_power_of_2(max(D, 16)), num_warps=cfg["num_warps"])
    return o, lse.to(lse_a.dtype)
