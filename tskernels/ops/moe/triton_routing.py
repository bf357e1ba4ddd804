"""Triton routing: softmax top-k and DeepSeek-V3 sigmoid + bias + grouped top-k.

One program routes BLOCK_T tokens; the whole row of E logits sits in registers (E <= 1024 for
every model that matters), laid out [token, group, expert-in-group] so that the grouped rule
reduces over the last axis. Top-k is k rounds of "take the maximum, lowest id on ties, mask
it": k and the group counts are small constexprs, so the rounds unroll. Nothing leaves the
device and the output sizes depend on T and k only (CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from ..shared import pdl

MAX_EXPERTS = 1024
DECODE_TOKENS = 16  # up to this many tokens: one token per one-warp program
_FORMATS = ("fp32", "fp16", "bf16")


@triton.jit
def _take_topk(choice, value, ids, w_ptr, id_ptr, rows, row_mask, K: tl.constexpr,
               K_P: tl.constexpr, BLOCK_T: tl.constexpr, BIG: tl.constexpr,
               RENORM: tl.constexpr, SCALE):
    """k rounds of argmax over `choice` [BLOCK_T, G, P] (lowest id on ties); the weight of a
    pick is `value` at the same place. Writes weights (renormalised, times SCALE) and ids."""
    slot = tl.arange(0, K_P)
    wk = tl.zeros((BLOCK_T, K_P), dtype=tl.float32)
    ik = tl.zeros((BLOCK_T, K_P), dtype=tl.int32)
    for i in tl.static_range(K):
        best = tl.max(tl.max(choice, axis=2), axis=1)
        hit = choice == best[:, None, None]
        pick = tl.min(tl.min(tl.where(hit, ids, BIG), axis=2), axis=1)
        chosen = ids == pick[:, None, None]
        w = tl.sum(tl.sum(tl.where(chosen, value, 0.0), axis=2), axis=1)
        wk = tl.where(slot[None, :] == i, w[:, None], wk)
        ik = tl.where(slot[None, :] == i, pick[:, None], ik)
        choice = tl.where(chosen, float("-inf"), choice)
    if RENORM:
        wk = wk / tl.sum(wk, axis=1)[:, None]
    wk = wk * SCALE
    offs = rows[:, None] * K + slot[None, :]
    m = row_mask[:, None] & (slot[None, :] < K)
    tl.store(w_ptr + offs, wk, mask=m)
    tl.store(id_ptr + offs, ik, mask=m)


@triton.jit
def _routing_kernel(logit_ptr, bias_ptr, w_ptr, id_ptr, T, stride_t, SCALE,
                    E: tl.constexpr, G: tl.constexpr, P: tl.constexpr, G_P: tl.constexpr,
                    P_P: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
                    TOPK_GROUP: tl.constexpr, SIGMOID: tl.constexpr, RENORM: tl.constexpr,
                    BLOCK_T: tl.constexpr, PDL: tl.constexpr = False):
    """Softmax (SIGMOID=False, G=1) or grouped sigmoid routing of BLOCK_T tokens.
    Logits [T, E] with E = G * P experts, expert id = g * P + p.
    PDL (pdl.CHAIN "moe_routing"): a programmatic dependent that waits for the router logits,
    then lets its dependents launch (after the wait, so they may read what this kernel's
    predecessors wrote before their own wait)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_mask = rows < T
    g = tl.arange(0, G_P)
    p = tl.arange(0, P_P)
    ids = (g[:, None] * P + p[None, :])[None, :, :]
    col_ok = ((g[:, None] < G) & (p[None, :] < P))[None, :, :]
    x = tl.load(logit_ptr + rows.to(tl.int64)[:, None, None] * stride_t + ids,
                mask=row_mask[:, None, None] & col_ok,
                other=float("-inf")).to(tl.float32)
    x = tl.where(row_mask[:, None, None], x, 0.0)  # rows past T: finite garbage, never stored
    if SIGMOID:
        s = tl.where(col_ok, 1.0 / (1.0 + tl.exp(-x)), 0.0)
        bias = tl.load(bias_ptr + ids, mask=col_ok, other=0.0).to(tl.float32)
        c = tl.where(col_ok, s + bias, float("-inf"))
        if TOPK_GROUP < G:
            # group score: the two best c of the group (a one-expert group counts its one)
            top1 = tl.max(c, axis=2)
            at1 = tl.min(tl.where(c == top1[:, :, None], ids, 1 << 30), axis=2)
            rest = tl.where(ids == at1[:, :, None], float("-inf"), c)
            top2 = tl.max(rest, axis=2)
            score = top1 + tl.where(top2 == float("-inf"), 0.0, top2)
            gid = tl.broadcast_to(g[None, :], (BLOCK_T, G_P))
            score = tl.where(gid < G, score, float("-inf"))
            keep = tl.zeros((BLOCK_T, G_P), dtype=tl.int1)
            for _ in tl.static_range(TOPK_GROUP):
                best = tl.max(score, axis=1)
                pick = tl.min(tl.where(score == best[:, None], gid, 1 << 30), axis=1)
                hit = gid == pick[:, None]
                keep = keep | hit
                score = tl.where(hit, float("-inf"), score)
            c = tl.where(keep[:, :, None], c, float("-inf"))
        _take_topk(c, s, ids, w_ptr, id_ptr, rows, row_mask, K, K_P, BLOCK_T, 1 << 30, RENORM,
                   SCALE)
    else:
        mx = tl.max(tl.max(x, axis=2), axis=1)
        ex = tl.where(col_ok, tl.exp(x - mx[:, None, None]), 0.0)
        prob = ex / tl.sum(tl.sum(ex, axis=2), axis=1)[:, None, None]
        prob = tl.where(col_ok, prob, float("-inf"))
        _take_topk(prob, prob, ids, w_ptr, id_ptr, rows, row_mask, K, K_P, BLOCK_T, 1 << 30,
                   RENORM, SCALE)


def _launch(logits, bias, top_k, *, n_group, topk_group, scale, renormalize, sigmoid):
    t, e = logits.shape
    if e > MAX_EXPERTS:
        raise ValueError(f"router_logits: the Triton router takes at most {MAX_EXPERTS} "
                         f"experts, got {e}")
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids
    per = e // n_group
    g_p, p_p = triton.next_power_of_2(n_group), triton.next_power_of_2(per)
    block_t = max(1, min(16, 2048 // (g_p * p_p)))
    warps = 4
    if t <= DECODE_TOKENS and g_p * p_p <= 512:
        # decode: one token per one-warp program, so each top-k round's reductions stay
        # inside the warp (shuffles) instead of crossing warps through shared memory
        block_t, warps = 1, 1
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    _routing_kernel[(triton.cdiv(t, block_t),)](
        x, bias if bias is not None else x, weights, ids, t, x.stride(0), float(scale),
        E=e, G=n_group, P=per, G_P=g_p, P_P=p_p, K=top_k, K_P=triton.next_power_of_2(top_k),
        TOPK_GROUP=topk_group, SIGMOID=sigmoid, RENORM=renormalize, BLOCK_T=block_t,
        num_warps=warps,
        # chained in its decode form only (one token per program: the form compiled and
        # measured with PDL; a prefill-sized routing gains nothing from it)
        **(pdl.launch_args(logits.device) if pdl.chained("moe_routing") and block_t == 1
           else {}))
    return weights, ids


def _cases():
    sig = {"logit_ptr": "*bf16", "bias_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32",
           "T": "i32", "stride_t": "i32", "SCALE": "fp32"}
    soft = dict(E=128, G=1, P=128, G_P=1, P_P=128, K=8, K_P=8, TOPK_GROUP=1, SIGMOID=False,
                RENORM=True, BLOCK_T=16)
    ds = dict(E=256, G=8, P=32, G_P=8, P_P=32, K=8, K_P=8, TOPK_GROUP=4, SIGMOID=True,
              RENORM=True, BLOCK_T=8)
    return {"softmax": [CompileCase(_routing_kernel, sig, soft, label="softmax_e128_k8",
                                    aligned=("stride_t",)),
                        CompileCase(_routing_kernel, sig, dict(soft, BLOCK_T=1), num_warps=1,
                                    label="softmax_e128_k8_decode", aligned=("stride_t",)),
                        CompileCase(_routing_kernel, sig, dict(soft, BLOCK_T=1, PDL=True),
                                    num_warps=1, label="softmax_e128_k8_decode_pdl",
                                    aligned=("stride_t",), targets=pdl.TARGETS)],
            "sigmoid": [CompileCase(_routing_kernel, {**sig, "logit_ptr": "*fp32"}, ds,
                                    label="sigmoid_e256_g8_k8", aligned=("stride_t",)),
                        CompileCase(_routing_kernel, {**sig, "logit_ptr": "*fp32"},
                                    dict(ds, BLOCK_T=1), num_warps=1,
                                    label="sigmoid_e256_g8_k8_decode", aligned=("stride_t",)),
                        CompileCase(_routing_kernel, {**sig, "logit_ptr": "*fp32"},
                                    dict(ds, BLOCK_T=1, PDL=True), num_warps=1,
                                    label="sigmoid_e256_g8_k8_decode_pdl",
                                    aligned=("stride_t",), targets=pdl.TARGETS)]}


@register("moe", "topk_softmax", **TRITON, formats={"router_logits": _FORMATS},
          traits={"num_experts": lambda e: e <= MAX_EXPERTS}, tags=("deterministic",),
          compile_cases=lambda: _cases()["softmax"])
def topk_softmax(router_logits, top_k, *, renormalize):
    """Triton softmax top-k routing (one program per 1-16 tokens; one warp per token at
    decode sizes)."""
    return _launch(router_logits, None, top_k, n_group=1, topk_group=1, scale=1.0,
                   renormalize=renormalize, sigmoid=False)


@register("moe", "topk_sigmoid_grouped", **TRITON,
          formats={"router_logits": _FORMATS, "correction_bias": _FORMATS},
          traits={"num_experts": lambda e: e <= MAX_EXPERTS}, tags=("deterministic",),
          compile_cases=lambda: _cases()["sigmoid"])
def topk_sigmoid_grouped(router_logits, correction_bias, top_k, *, n_group, topk_group,
                         routed_scaling_factor, renormalize):
    """Triton DeepSeek-V3 sigmoid + bias + grouped top-k routing."""
    return _launch(router_logits, correction_bias.contiguous(), top_k, n_group=n_group,
                   topk_group=topk_group, scale=routed_scaling_factor,
                   renormalize=renormalize, sigmoid=True)
