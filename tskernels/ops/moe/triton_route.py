"""A softmax-routed MoE block's entry in one launch: (fused add +) RMSNorm, the router
projection and softmax top-k routing (moe.rmsnorm_router_topk_softmax).

At decode sizes the three unfused launches (fused add + RMSNorm, the router gemv over an
[E, H] weight of ~0.5 MB, the routing) are each a short latency chain: each pays a launch and
a dependency wait for a few microseconds of work. Here one grid of T x NP programs does it:
program (t, p) normalises token t's row (every program recomputes the row's sum of squares:
H values, cheaper than a second launch), stores its share of the normalised row y and of the
residual stream r, and computes router logits for experts [p * EB, (p + 1) * EB) from y
(rounded to x's dtype, as the unfused path feeds its gemv), rounded to x's dtype as the
linear layer returns them. It writes them to an fp32 workspace and takes a ticket on the
token's arrival counter (acq_rel); the token's last program reads the E logits back and
routes them with the same arithmetic as moe.topk_softmax's Triton kernel (triton_routing:
softmax in fp32, k rounds of argmax with the lowest id on ties, renormalised), then re-arms
the counter. Chained (pdl.CHAIN "moe_router"): each program asks L2 for its slice of the
router weight before it waits for its predecessor (weights are never written by a step), and
lets its dependents (the decode experts' gate-up) launch once it has waited.

The arrival counters are a per-device buffer the kernel re-zeroes, so two streams of one device
must not run this op concurrently (as the decode experts' slot down).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared import counters, pdl
from .triton_routing import MAX_EXPERTS, _take_topk

EXPERTS_PER_PROGRAM = 8
MAX_TOKENS = 1024  # arrival counters per device (one per token)
MAX_HIDDEN = 16384
CHUNK = 2048  # hidden columns per step of a program's loops
_FORMATS = ("fp32", "fp16", "bf16")


@triton.jit
def _row(x_ptr, res_ptr, row, cols, cmask, x_stride, res_stride, HAS_RES: tl.constexpr):
    """Token `row`'s columns `cols` of x (+ residual, the sum rounded to x's dtype)."""
    x = tl.load(x_ptr + row * x_stride + cols, mask=cmask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * res_stride + cols, mask=cmask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _norm_route_kernel(x_ptr, res_ptr, nw_ptr, gw_ptr, y_ptr, res_out_ptr, lg_ptr, cnt_ptr,
                       w_ptr, id_ptr, H, E, x_stride, res_stride, gw_stride, y_stride,
                       res_out_stride, eps, HAS_RES: tl.constexpr, EB: tl.constexpr,
                       BLOCK_H: tl.constexpr, E_P: tl.constexpr, K: tl.constexpr,
                       K_P: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr = False):
    t = tl.program_id(0)
    p = tl.program_id(1)
    n_prog = tl.num_programs(1)
    row = t.to(tl.int64)
    e = p * EB + tl.arange(0, EB)
    e_ok = e < E
    cols = tl.arange(0, BLOCK_H)
    g_rows = gw_ptr + e.to(tl.int64)[:, None] * gw_stride
    if PDL:
        # this program's router rows into L2 (one request per 128-byte line), then the wait
        lines = tl.arange(0, BLOCK_H // 64) * 64
        for h0 in range(0, H, BLOCK_H):
            pdl.prefetch_l2(g_rows + h0 + lines[None, :],
                            e_ok[:, None] & (h0 + lines[None, :] < H))
        gdc_wait()
        gdc_launch_dependents()
    # the row's sum of squares (of the rounded sum, as the unfused fused_add_rmsnorm reads it)
    ss = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        c = h0 + cols
        xf = _row(x_ptr, res_ptr, row, c, c < H, x_stride, res_stride, HAS_RES).to(tl.float32)
        ss += xf * xf
    inv = tl.rsqrt(tl.sum(ss, axis=0) / H + eps)
    # y (rounded to x's dtype) and this program's share of the y / r stores; the logits
    share = tl.cdiv(H, n_prog)
    lo = p * share
    acc = tl.zeros((EB,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        c = h0 + cols
        cm = c < H
        x = _row(x_ptr, res_ptr, row, c, cm, x_stride, res_stride, HAS_RES)
        w = tl.load(nw_ptr + c, mask=cm, other=0.0).to(tl.float32)
        y = (x.to(tl.float32) * inv * w).to(y_ptr.dtype.element_ty)
        mine = cm & (c >= lo) & (c < lo + share)
        tl.store(y_ptr + row * y_stride + c, y, mask=mine)
        if HAS_RES:
            tl.store(res_out_ptr + row * res_out_stride + c, x, mask=mine)
        g = tl.load(g_rows + c[None, :], mask=e_ok[:, None] & cm[None, :], other=0.0)
        acc += tl.sum(g.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)
    logit = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(lg_ptr + row * E + e, logit, mask=e_ok)
    # every thread's logits are stored (barrier) before one release-add counts this program
    # in; the acquiring last program of the token reads the others' logits past L1 (.cg)
    tl.debug_barrier()
    sem = cnt_ptr + t
    done = tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu")
    if done == n_prog - 1:
        tl.store(sem, 0)  # re-armed for the next launch (stream-ordered)
        ids = tl.arange(0, E_P)[None, None, :]
        ok = ids < E
        x = tl.load(lg_ptr + row * E + ids, mask=ok, other=float("-inf"), cache_modifier=".cg")
        mx = tl.max(tl.max(x, axis=2), axis=1)
        ex = tl.where(ok, tl.exp(x - mx[:, None, None]), 0.0)
        prob = ex / tl.sum(tl.sum(ex, axis=2), axis=1)[:, None, None]
        prob = tl.where(ok, prob, float("-inf"))
        rows = t + tl.arange(0, 1)
        _take_topk(prob, prob, ids, w_ptr, id_ptr, rows, rows == t, K, K_P, 1, 1 << 30,
                   RENORM, 1.0)


def _counters(device: torch.device) -> torch.Tensor:
    """The device's arrival counters (shared/counters.py); the kernel re-zeroes what it used."""
    return counters.zeroed(__name__, device, MAX_TOKENS)


def _block_h(hidden: int) -> int:
    return min(CHUNK, triton.next_power_of_2(hidden))


@register("moe", "rmsnorm_router_topk_softmax", **TRITON, formats={"x": _FORMATS},
          traits={"num_experts": lambda e: e <= MAX_EXPERTS,
                  "tokens": lambda t: t <= MAX_TOKENS,
                  "hidden": lambda h: h <= MAX_HIDDEN},
          tags=("deterministic",), compile_cases=lambda: _cases())
def rmsnorm_router_topk_softmax(x, norm_weight, gate_weight, top_k, *, residual, eps,
                                renormalize):
    """Triton: one launch of T x ceil(E / 8) programs, the last of a token's programs
    routing it (arrival counter)."""
    tokens, hidden = x.shape
    num_experts = gate_weight.shape[0]
    y = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else None
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=x.device)
    if tokens == 0:
        return y, res_out, weights, ids
    logits = torch.empty(tokens, num_experts, dtype=torch.float32, device=x.device)
    n_prog = triton.cdiv(num_experts, EXPERTS_PER_PROGRAM)
    res = residual if residual is not None else x
    _norm_route_kernel[(tokens, n_prog)](
        x, res, norm_weight, gate_weight, y, res_out if res_out is not None else y, logits,
        _counters(x.device), weights, ids, hidden, num_experts, x.stride(0), res.stride(0),
        gate_weight.stride(0), y.stride(0), (res_out if res_out is not None else y).stride(0),
        float(eps), HAS_RES=residual is not None, EB=EXPERTS_PER_PROGRAM,
        BLOCK_H=_block_h(hidden), E_P=triton.next_power_of_2(num_experts), K=top_k,
        K_P=triton.next_power_of_2(top_k), RENORM=renormalize, num_warps=4,
        **(pdl.launch_args(x.device) if pdl.chained("moe_router") else {}))
    return y, res_out, weights, ids


def _cases():
    sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "nw_ptr": "*bf16", "gw_ptr": "*bf16",
           "y_ptr": "*bf16", "res_out_ptr": "*bf16", "lg_ptr": "*fp32", "cnt_ptr": "*i32",
           "w_ptr": "*fp32", "id_ptr": "*i32", "H": "i32", "E": "i32", "x_stride": "i32",
           "res_stride": "i32", "gw_stride": "i32", "y_stride": "i32",
           "res_out_stride": "i32", "eps": "fp32"}
    qwen3 = dict(HAS_RES=True, EB=EXPERTS_PER_PROGRAM, BLOCK_H=2048, E_P=128, K=8, K_P=8,
                 RENORM=True)
    al = ("x_stride", "res_stride", "gw_stride", "y_stride", "res_out_stride")
    return [CompileCase(_norm_route_kernel, sig, qwen3, num_warps=4, label="h2048_e128_k8",
                        aligned=al),
            CompileCase(_norm_route_kernel, sig, dict(qwen3, PDL=True), num_warps=4,
                        label="h2048_e128_k8_pdl", aligned=al, targets=pdl.TARGETS)]
