"""Decode-sized fused experts without the align step: two launches after routing, indexed by
the routing slots directly.

At T <= a few tokens the aligned path's align launch (a one-program latency chain), the
[T*k, H] expert-output buffer and the separate combine launch cost more than the weight
stream itself. Here:

  slot_gate_up: one program per (routing slot s = t * k + j, BLOCK_N intermediate columns):
      act[s] = silu(x[t] W_gate[e]^T) * (x[t] W_up[e]^T), e = topk_ids[t, j]
  slot_down ("slot", the default): one program per (slot, BLOCK_N hidden columns) writes its
      weighted fp32 partial topk_weights[t, j] * act[s] W2[e]^T; the last of a token's k
      programs to arrive at that column tile (an arrival counter, as in the split-KV decode)
      sums the k partials in slot order and writes out[t] (the combine, fused; deterministic).
  token_down ("token"): one program per (token, BLOCK_N hidden columns) loops over the k slots
      in one pipelined loop, accumulating in fp32 (fewer, longer programs; no counters).

Each expert's weights are read once per slot that routes to it: with distinct experts per
token (T = 1) that is once; when several of the few tokens share an expert the repeats
come from L2 while they run together. The activation row is padded to 16 rows (the smallest
mma tile), only row 0 is loaded. Ids outside [0, E) contribute nothing (their gate-up program
exits; the down masks their loads and weight to zero). bf16 / fp16 weights only (block-fp8
experts take the aligned path). Two launches measured faster than one (H100, session 27: a
single grid of gate-up tickets then down tickets spinning on per-slot done counters, T = 1
37.6 vs 34.7 us; with the down weight prefetched before the wait 40-47 us), and faster than
persistent grids (session 26). The arrival counters are a per-device buffer the kernels
re-zero, so two streams of one device must not run this path concurrently.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ..shared import counters, pdl
from .triton_gemm import _gelu_tanh


@dataclass(frozen=True)
class DirectTiles:
    up_n: int = 32
    up_k: int = 128
    up_warps: int = 4
    up_stages: int = 4
    down_n: int = 64
    down_k: int = 128
    down_warps: int = 4
    down_stages: int = 4
    down: str = "slot"  # or "token"


DEFAULT = DirectTiles()
TOKEN_DOWN = DirectTiles(down_n=16, down_k=256, down="token")
CNT_ELEMS = 1 << 14  # arrival counters per device (T x H / BLOCK_N tiles)
# the aligned path takes over above this many tokens (each slot re-reads its expert here;
# from ~16 tokens on, many slots share experts and the aligned grouping reads them once)
MAX_TOKENS = 8


@triton.jit
def slot_gate_up_kernel(x_ptr, w_ptr, ids_ptr, act_ptr, E, I, H, stride_xt, stride_we,
                        stride_wn, stride_as,
                        TOP_K: tl.constexpr, GELU: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # wait for the routing, then let the down launch (it reads the ids early)
        gdc_wait()
        gdc_launch_dependents()
    s = tl.program_id(0)
    e = tl.load(ids_ptr + s).to(tl.int64)
    if (e < 0) | (e >= E):
        return
    t = (s // TOP_K).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    r = tl.arange(0, 16)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + t * stride_xt + r[:, None] * 0 + k[None, :]
    g_ptrs = w_ptr + e * stride_we + n.to(tl.int64)[None, :] * stride_wn + k[:, None]
    u_ptrs = g_ptrs + I * stride_wn
    acc_g = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for kk in range(0, H, BLOCK_K):
        k_ok = k < H - kk
        a = tl.load(a_ptrs, mask=(r[:, None] == 0) & k_ok[None, :], other=0.0)
        wm = n_ok[None, :] & k_ok[:, None]
        bg = tl.load(g_ptrs, mask=wm, other=0.0, eviction_policy="evict_first")
        bu = tl.load(u_ptrs, mask=wm, other=0.0, eviction_policy="evict_first")
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if GELU:
        act = _gelu_tanh(acc_g) * acc_u
    else:
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    act = tl.sum(act, axis=0)  # rows 1.. are zero (act(0) * 0)
    tl.store(act_ptr + s.to(tl.int64) * stride_as + n, act.to(act_ptr.dtype.element_ty),
             mask=n_ok)


@triton.jit
def token_down_kernel(act_ptr, w_ptr, ids_ptr, tw_ptr, out_ptr, E, H, I, stride_as,
                      stride_we, stride_wn, stride_ot,
                      TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    r = tl.arange(0, 16)
    kr = tl.arange(0, BLOCK_K)
    k_tiles = tl.cdiv(I, BLOCK_K)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    # one loop over (slot, K tile) so the weight stream stays pipelined across slots
    for it in range(0, TOP_K * k_tiles):
        j = it // k_tiles
        k = (it % k_tiles) * BLOCK_K + kr
        s = t * TOP_K + j
        e = tl.load(ids_ptr + s).to(tl.int64)
        ok = (e >= 0) & (e < E)
        wt = tl.where(ok, tl.load(tw_ptr + s), 0.0)
        e = tl.where(ok, e, 0)
        k_ok = (k < I) & ok
        a = tl.load(act_ptr + s * stride_as + r[:, None] * 0 + k[None, :],
                    mask=(r[:, None] == 0) & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + e * stride_we + n.to(tl.int64)[None, :] * stride_wn + k[:, None],
                    mask=n_ok[None, :] & k_ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        acc += tl.dot(a, b) * wt
    out = tl.sum(acc, axis=0)
    tl.store(out_ptr + t * stride_ot + n, out.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def slot_down_kernel(act_ptr, w_ptr, ids_ptr, tw_ptr, part_ptr, cnt_ptr, out_ptr, E, H, I,
                     stride_as, stride_we, stride_wn, stride_ot,
                     TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PDL: tl.constexpr = False):
    """PDL: a programmatic dependent of slot_gate_up_kernel (launched once every gate-up
    program has waited for the routing, so the ids are final): it lets its own dependents
    launch, reads its expert id, and waits for the gate-up (the activations, the partials
    and counters of the previous call) before anything else. (Asking L2 for its first 2 / 4
    weight tiles before that wait was slower on the H200: benchmarks/RESULTS.md, session 18.)"""
    if PDL:
        gdc_launch_dependents()
    s = tl.program_id(0)
    pid_n = tl.program_id(1)
    t = s // TOP_K
    e = tl.load(ids_ptr + s).to(tl.int64)
    ok = (e >= 0) & (e < E)
    e = tl.where(ok, e, 0)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    r = tl.arange(0, 16)
    k = tl.arange(0, BLOCK_K)
    if PDL:
        gdc_wait()
    a_ptrs = act_ptr + s.to(tl.int64) * stride_as + r[:, None] * 0 + k[None, :]
    b_ptrs = w_ptr + e * stride_we + n.to(tl.int64)[None, :] * stride_wn + k[:, None]
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for kk in range(0, I, BLOCK_K):
        k_ok = (k < I - kk) & ok
        a = tl.load(a_ptrs, mask=(r[:, None] == 0) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    wt = tl.where(ok, tl.load(tw_ptr + s), 0.0)
    part = tl.sum(acc, axis=0) * wt  # rows 1.. are zero
    tl.store(part_ptr + s.to(tl.int64) * H + n, part, mask=n_ok)
    # every thread's partial is stored (barrier) before one release-add counts this slot in;
    # the acquiring last slot of the token reads the others' partials past L1 (.cg)
    tl.debug_barrier()
    sem = cnt_ptr + t * tl.num_programs(1) + pid_n
    done = tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu")
    if done == TOP_K - 1:
        tl.store(sem, 0)  # re-armed for the next launch (stream-ordered)
        j = tl.arange(0, TOP_K)
        rows = (t * TOP_K + j).to(tl.int64)
        p = tl.load(part_ptr + rows[:, None] * H + n[None, :], mask=n_ok[None, :], other=0.0,
                    cache_modifier=".cg")
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + n,
                 tl.sum(p, axis=0).to(out_ptr.dtype.element_ty), mask=n_ok)


def _counters(device: torch.device) -> torch.Tensor:
    """The device's arrival counters (shared/counters.py); the kernel re-zeroes what it used."""
    return counters.zeroed(__name__, device, CNT_ELEMS)


def direct_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   activation: str = "silu", tiles: DirectTiles | None = None) -> torch.Tensor:
    """out [T, H] (x's dtype) = the fused-experts layer for bf16 / fp16 weights, contiguous
    x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights float32 [T, k], topk_ids [T, k]."""
    cfg = tiles or DEFAULT
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    tw = topk_weights.float().contiguous()
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    n_tiles = triton.cdiv(hidden, cfg.down_n)
    pow2_k = (top_k & (top_k - 1)) == 0  # the last arrival sums a [k, BLOCK_N] tile
    slot = cfg.down == "slot" and pow2_k and tokens * n_tiles <= CNT_ELEMS
    # chained (pdl.CHAIN "moe_direct"): gate-up and the slot down as programmatic dependents
    # (H200, Qwen3-30B-A3B layer: T = 1 27.8 -> 26.7 us with "moe_routing"); the
    # token down stays plain
    chain = pdl.launch_args(x.device) if slot and pdl.chained("moe_direct") else {}
    slot_gate_up_kernel[(tokens * top_k, triton.cdiv(inter, cfg.up_n))](
        x, w13, ids, act, num_experts, inter, hidden, x.stride(0), w13.stride(0),
        w13.stride(1), act.stride(0), TOP_K=top_k, GELU=activation == "gelu",
        BLOCK_N=cfg.up_n, BLOCK_K=cfg.up_k, num_warps=cfg.up_warps, num_stages=cfg.up_stages,
        **chain)
    if slot:
        part = torch.empty(tokens * top_k, hidden, dtype=torch.float32, device=x.device)
        slot_down_kernel[(tokens * top_k, n_tiles)](
            act, w2, ids, tw, part, _counters(x.device), out, num_experts, hidden, inter,
            act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), TOP_K=top_k,
            BLOCK_N=cfg.down_n, BLOCK_K=cfg.down_k, num_warps=cfg.down_warps,
            num_stages=cfg.down_stages, **chain)
        return out
    n_tok = cfg.down_n if cfg.down == "token" else TOKEN_DOWN.down_n
    token_down_kernel[(tokens, triton.cdiv(hidden, n_tok))](
        act, w2, ids, tw, out, num_experts, hidden, inter, act.stride(0), w2.stride(0),
        w2.stride(1), out.stride(0), TOP_K=top_k, BLOCK_N=n_tok,
        BLOCK_K=cfg.down_k if cfg.down == "token" else TOKEN_DOWN.down_k,
        num_warps=cfg.down_warps, num_stages=cfg.down_stages)
    return out


def compile_cases() -> list[CompileCase]:
    """The three kernels at the decode tiles (bf16, top-8; the gate-up and the slot down
    also in their chained PDL form); their dots have 16 rows."""
    c, t = DEFAULT, TOKEN_DOWN
    up_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "act_ptr": "*bf16",
              "E": "i32", "I": "i32", "H": "i32", "stride_xt": "i32", "stride_we": "i32",
              "stride_wn": "i32", "stride_as": "i32"}
    dn_sig = {"act_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32",
              "out_ptr": "*bf16", "E": "i32", "H": "i32", "I": "i32", "stride_as": "i32",
              "stride_we": "i32", "stride_wn": "i32", "stride_ot": "i32"}
    sl_sig = {"act_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32",
              "part_ptr": "*fp32", "cnt_ptr": "*i32", "out_ptr": "*bf16", "E": "i32",
              "H": "i32", "I": "i32", "stride_as": "i32", "stride_we": "i32",
              "stride_wn": "i32", "stride_ot": "i32"}
    return [
        CompileCase(slot_gate_up_kernel, up_sig,
                    dict(TOP_K=8, GELU=False, BLOCK_N=c.up_n, BLOCK_K=c.up_k),
                    num_warps=c.up_warps, num_stages=c.up_stages, uses_dot=True,
                    narrow_dot=True, label="direct_gate_up",
                    aligned=("stride_xt", "stride_we", "stride_wn", "stride_as")),
        CompileCase(slot_down_kernel, sl_sig,
                    dict(TOP_K=8, BLOCK_N=c.down_n, BLOCK_K=c.down_k),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_slot_down",
                    aligned=("stride_as", "stride_we", "stride_wn", "stride_ot")),
        CompileCase(slot_gate_up_kernel, up_sig,
                    dict(TOP_K=8, GELU=False, BLOCK_N=c.up_n, BLOCK_K=c.up_k, PDL=True),
                    num_warps=c.up_warps, num_stages=c.up_stages, uses_dot=True,
                    narrow_dot=True, label="direct_gate_up_pdl", targets=pdl.TARGETS,
                    aligned=("stride_xt", "stride_we", "stride_wn", "stride_as")),
        CompileCase(slot_down_kernel, sl_sig,
                    dict(TOP_K=8, BLOCK_N=c.down_n, BLOCK_K=c.down_k, PDL=True),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_slot_down_pdl", targets=pdl.TARGETS,
                    aligned=("stride_as", "stride_we", "stride_wn", "stride_ot")),
        CompileCase(token_down_kernel, dn_sig,
                    dict(TOP_K=8, BLOCK_N=t.down_n, BLOCK_K=t.down_k),
                    num_warps=t.down_warps, num_stages=t.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_token_down",
                    aligned=("stride_as", "stride_we", "stride_wn", "stride_ot")),
    ]
