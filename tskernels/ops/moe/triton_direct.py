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
experts take the aligned path). The arrival counters are a per-device buffer the kernels
re-zero, so two streams of one device must not run this path concurrently.

PERSIST (off by default, not yet timed on a GPU): the same two launches as persistent grids
(persist_gate_up_kernel, persist_down_kernel): as many programs as fit resident (from the
compiled kernel's registers and shared memory) x the SMs, capped by the work units and evened
out; each program walks its units (column block, slot) and their K tiles as one flat loop, so
the cp.async pipeline runs across unit boundaries (no second, partial wave, no refill per
tile). Every slot's id sits in registers (an id loaded in the loop makes the weight loads
indirect, which Triton's pipeliner gives one buffer). The down keeps the fused combine (any
top-k: the last arrival sums the k partials in slot order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ..shared import pdl, persist
from ..shared.pdl import prefetch_l2
from ..shared.persist import cta_sync
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
_cnt: dict[torch.device, torch.Tensor] = {}
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


# ---- the persistent form (PERSIST) --------------------------------------------------------
@triton.jit
def persist_gate_up_kernel(x_ptr, w_ptr, ids_ptr, act_ptr, E, I, H, S, stride_xt, stride_we,
                           stride_wn, stride_as, UNITS, P,
                           KT: tl.constexpr, SP: tl.constexpr, TOP_K: tl.constexpr,
                           GELU: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           EVEN_K: tl.constexpr, PDL: tl.constexpr = False):
    """slot_gate_up_kernel as a persistent grid: P programs (as many as fit resident) share
    the UNITS = cdiv(I, BLOCK_N) * S work units, unit u = (column block u // S, slot u % S)
    (a column block's S slots are neighbours, so slots of one expert read its tiles from L2
    together), and program p walks its units p, p + P, ... and their KT K tiles as one flat
    loop: the software pipeline (num_stages gate + up tiles in flight) runs on from one unit
    into the next. A unit whose id is outside [0, E) loads and stores nothing. PDL: waits for
    the routing first (the ids address the weights), then lets the down launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    total = ((UNITS - pid + P - 1) // P) * KT
    r = tl.arange(0, 16)
    kr = tl.arange(0, BLOCK_K)
    cn = tl.arange(0, BLOCK_N)
    # every slot's id in registers: an id loaded inside the loop would make the weight loads
    # indirect, and Triton's pipeliner then gives them a single buffer
    sl = tl.arange(0, SP)
    idv = tl.load(ids_ptr + sl, mask=sl < S, other=-1).to(tl.int32)
    acc_g = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for it in range(0, total):
        u = pid + (it // KT) * P
        s = u % S
        n = (u // S) * BLOCK_N + cn
        k = (it % KT) * BLOCK_K + kr
        e = tl.sum(tl.where(sl == s, idv, 0)).to(tl.int64)
        ok = (e >= 0) & (e < E)
        e = tl.where(ok, e, 0)
        t = (s // TOP_K).to(tl.int64)
        n_ok = (n < I) & ok
        if EVEN_K:  # masks broadcast over K
            am = r[:, None] == 0
            wm = n_ok[None, :]
        else:
            am = (r[:, None] == 0) & (k < H)[None, :]
            wm = n_ok[None, :] & (k < H)[:, None]
        a = tl.load(x_ptr + t * stride_xt + r[:, None] * 0 + k[None, :], mask=am, other=0.0)
        g_ptrs = w_ptr + e * stride_we + n.to(tl.int64)[None, :] * stride_wn + k[:, None]
        bg = tl.load(g_ptrs, mask=wm, other=0.0, eviction_policy="evict_first")
        bu = tl.load(g_ptrs + I * stride_wn, mask=wm, other=0.0, eviction_policy="evict_first")
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
        if it % KT == KT - 1:  # the unit's last K tile
            if GELU:
                act = _gelu_tanh(acc_g) * acc_u
            else:
                act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            act = tl.sum(act, axis=0)  # rows 1.. are zero (act(0) * 0)
            tl.store(act_ptr + s.to(tl.int64) * stride_as + n,
                     act.to(act_ptr.dtype.element_ty), mask=n_ok)
            acc_g = tl.zeros((16, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((16, BLOCK_N), dtype=tl.float32)


@triton.jit
def persist_down_kernel(act_ptr, w_ptr, ids_ptr, tw_ptr, part_ptr, cnt_ptr, out_ptr, E, H, I,
                        S, NB, stride_as, stride_we, stride_wn, stride_ot, UNITS, P,
                        KT: tl.constexpr, SP: tl.constexpr, TOP_K: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                        PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0,
                        ASM_SYNC: tl.constexpr = False):
    """slot_down_kernel as a persistent grid: UNITS = NB * S units (hidden block u // S of
    BLOCK_N columns, slot u % S), program p walking its units p, p + P, ... and their KT K
    tiles as one flat pipelined loop. At a unit's last tile it stores its weighted fp32
    partial, and the last of the token's TOP_K slots to arrive at that block (arrival counter
    cnt[t * NB + block]) re-arms the counter and writes out[t] = the sum of the TOP_K
    partials in slot order (deterministic; any TOP_K). Ids outside [0, E) load nothing and
    contribute a zero partial. ASM_SYNC: the CTA barrier before the arrival as inline PTX
    (bar.sync; tl.debug_barrier would stop the loop's pipelining), NVIDIA only.
    PDL: a programmatic dependent of the gate-up (whose programs wait for the routing before
    they trigger, so the ids are final): it lets its dependents launch, asks L2 for the first
    PREFETCH weight tiles of its first unit (reading that unit's id), then waits for the
    gate-up (the activations, the partials and counters of the previous call)."""
    pid = tl.program_id(0)
    total = ((UNITS - pid + P - 1) // P) * KT
    r = tl.arange(0, 16)
    kr = tl.arange(0, BLOCK_K)
    cn = tl.arange(0, BLOCK_N)
    if PDL:
        gdc_launch_dependents()
        if PREFETCH > 0:
            LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # 128 B
            s0 = pid % S
            e0 = tl.load(ids_ptr + s0).to(tl.int64)
            ok0 = (e0 >= 0) & (e0 < E) & (pid < UNITS)
            n0 = (pid // S) * BLOCK_N + cn
            cols = tl.arange(0, PREFETCH * BLOCK_K // LINE) * LINE
            prefetch_l2(w_ptr + tl.where(ok0, e0, 0) * stride_we
                        + n0.to(tl.int64)[:, None] * stride_wn + cols[None, :],
                        (n0 < H)[:, None] & (cols < I)[None, :] & ok0)
        gdc_wait()
    sl = tl.arange(0, SP)  # every slot's id in registers (see persist_gate_up_kernel)
    idv = tl.load(ids_ptr + sl, mask=sl < S, other=-1).to(tl.int32)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for it in range(0, total):
        u = pid + (it // KT) * P
        s = u % S
        nb = u // S
        n = nb * BLOCK_N + cn
        n_ok = n < H
        k = (it % KT) * BLOCK_K + kr
        e = tl.sum(tl.where(sl == s, idv, 0)).to(tl.int64)
        ok = (e >= 0) & (e < E)
        e = tl.where(ok, e, 0)
        if EVEN_K:  # masks broadcast over K
            am = (r[:, None] == 0) & ok
            wm = n_ok[None, :] & ok
        else:
            k_ok = (k < I) & ok
            am = (r[:, None] == 0) & k_ok[None, :]
            wm = n_ok[None, :] & k_ok[:, None]
        a = tl.load(act_ptr + s.to(tl.int64) * stride_as + r[:, None] * 0 + k[None, :],
                    mask=am, other=0.0)
        b = tl.load(w_ptr + e * stride_we + n.to(tl.int64)[None, :] * stride_wn + k[:, None],
                    mask=wm, other=0.0, eviction_policy="evict_first")
        acc = tl.dot(a, b, acc)
        if it % KT == KT - 1:  # the unit's last K tile: its partial, then the arrival
            wt = tl.where(ok, tl.load(tw_ptr + s), 0.0)
            part = tl.sum(acc, axis=0) * wt  # rows 1.. are zero
            tl.store(part_ptr + s.to(tl.int64) * H + n, part, mask=n_ok)
            # every thread's partial is stored (CTA barrier) before one release-add counts
            # this slot in; the acquiring last slot reads the others' partials past L1 (.cg)
            if ASM_SYNC:
                nb = cta_sync(nb)
            else:
                tl.debug_barrier()
            t = s // TOP_K
            sem = cnt_ptr + t * NB + nb
            done = tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu")
            if done == TOP_K - 1:
                tl.store(sem, 0)  # re-armed for the next launch (stream-ordered)
                rows = part_ptr + (t * TOP_K).to(tl.int64) * H + n
                tot = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for j in tl.static_range(TOP_K):
                    tot += tl.load(rows + j * H, mask=n_ok, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + t.to(tl.int64) * stride_ot + n,
                         tot.to(out_ptr.dtype.element_ty), mask=n_ok)
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)


@dataclass(frozen=True)
class PersistTiles:
    """Launch config of the persistent form: column block / K tile / warps / stages of each
    kernel, and programs per SM (None: as many as fit resident). down_prefetch: weight tiles
    of its first unit the chained down asks into L2 before its PDL wait (0: none)."""
    up_n: int = 16
    up_k: int = 128
    up_warps: int = 4
    up_stages: int = 4
    up_per_sm: int | None = None
    down_n: int = 32
    down_k: int = 128
    down_warps: int = 4
    down_stages: int = 4
    down_per_sm: int | None = None
    down_prefetch: int = 0


# the decode path's persistent form (persist_gate_up_kernel + persist_down_kernel) with this
# config in place of the one-program-per-tile grids; None: off (not yet timed on a GPU:
# benchmarks/s26_moe_persist_gpu.py)
PERSIST: PersistTiles | None = None
# the last persistent launch's grids (programs, units, resident programs per SM, K tiles per
# unit) per kernel, for the lab scripts
LAST_GRIDS: dict[str, dict] = {}


def _persist_experts(x, w13, w2, tw, ids, out, act, activation, cfg: PersistTiles) -> None:
    """The two persistent launches (see the kernels), chained as pdl "moe_direct"."""
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    slots = tokens * top_k
    dev = x.device
    nvidia = dev.type == "cuda" and torch.version.hip is None  # the PTX barrier
    chain = pdl.launch_args(dev) if pdl.chained("moe_direct") else {"PDL": False}
    flag = chain.pop("PDL")
    sms = persist.num_sms(dev)
    # gate-up: (column block, slot) units over H / up_k tiles
    bk = min(cfg.up_k, max(16, triton.next_power_of_2(hidden)))
    units = triton.cdiv(inter, cfg.up_n) * slots
    args = (x, w13, ids, act, num_experts, inter, hidden, slots, x.stride(0), w13.stride(0),
            w13.stride(1), act.stride(0), units)
    sp = triton.next_power_of_2(slots)
    meta = dict(KT=triton.cdiv(hidden, bk), SP=sp, TOP_K=top_k, GELU=activation == "gelu",
                BLOCK_N=cfg.up_n, BLOCK_K=bk, EVEN_K=hidden % bk == 0, PDL=flag,
                num_warps=cfg.up_warps, num_stages=cfg.up_stages)
    res = persist.resident(persist_gate_up_kernel, dev, args + (sms,), meta, cfg.up_per_sm)
    p = persist.even_grid(units, sms * res)
    LAST_GRIDS["gate_up"] = dict(programs=p, units=units, per_sm=res, k_tiles=meta["KT"])
    persist_gate_up_kernel[(p,)](*args, p, **meta, **chain)
    # down: (hidden block, slot) units over I / down_k tiles, the combine fused
    bk = min(cfg.down_k, max(16, triton.next_power_of_2(inter)))
    nb = triton.cdiv(hidden, cfg.down_n)
    units = nb * slots
    part = torch.empty(slots, hidden, dtype=torch.float32, device=dev)
    args = (act, w2, ids, tw, part, _counters(dev), out, num_experts, hidden, inter, slots, nb,
            act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), units)
    meta = dict(KT=triton.cdiv(inter, bk), SP=sp, TOP_K=top_k, BLOCK_N=cfg.down_n, BLOCK_K=bk,
                EVEN_K=inter % bk == 0, PDL=flag,
                PREFETCH=triton.next_power_of_2(cfg.down_prefetch) if flag and
                cfg.down_prefetch else 0,
                ASM_SYNC=nvidia, num_warps=cfg.down_warps, num_stages=cfg.down_stages)
    res = persist.resident(persist_down_kernel, dev, args + (sms,), meta, cfg.down_per_sm)
    p = persist.even_grid(units, sms * res)
    LAST_GRIDS["down"] = dict(programs=p, units=units, per_sm=res, k_tiles=meta["KT"])
    persist_down_kernel[(p,)](*args, p, **meta, **chain)


def _counters(device: torch.device) -> torch.Tensor:
    """The device's arrival counters, zeroed once (allocated on first use, before any graph
    capture that uses them, as the serving warm-up does); the kernel re-zeroes what it used."""
    c = _cnt.get(device)
    if c is None:
        c = _cnt[device] = torch.zeros(CNT_ELEMS, dtype=torch.int32, device=device)
    return c


def direct_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   activation: str = "silu",
                   tiles: DirectTiles | PersistTiles | None = None) -> torch.Tensor:
    """out [T, H] (x's dtype) = the fused-experts layer for bf16 / fp16 weights, contiguous
    x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights float32 [T, k], topk_ids [T, k].
    tiles: the launch config (None: PERSIST if set, else DEFAULT); PersistTiles takes the
    persistent kernels."""
    cfg = tiles or PERSIST or DEFAULT
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
    if isinstance(cfg, PersistTiles):
        if tokens * triton.cdiv(hidden, cfg.down_n) <= CNT_ELEMS:
            _persist_experts(x, w13, w2, tw, ids, out, act, activation, cfg)
            return out
        cfg = DEFAULT  # more arrival counters than the buffer holds: the tile grids
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
        *_persist_cases(PERSIST or PersistTiles()),
        CompileCase(token_down_kernel, dn_sig,
                    dict(TOP_K=8, BLOCK_N=t.down_n, BLOCK_K=t.down_k),
                    num_warps=t.down_warps, num_stages=t.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_token_down",
                    aligned=("stride_as", "stride_we", "stride_wn", "stride_ot")),
    ]


def _persist_cases(c: PersistTiles) -> list[CompileCase]:
    """The persistent kernels as the Qwen3-30B-A3B layer launches them (H 2048, I 768, top-8,
    bf16): plain and chained; the down with its barrier as PTX (ASM_SYNC) on NVIDIA."""
    up_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "act_ptr": "*bf16",
              "E": "i32", "I": "i32", "H": "i32", "S": "i32", "stride_xt": "i32",
              "stride_we": "i32", "stride_wn": "i32", "stride_as": "i32", "UNITS": "i32",
              "P": "i32"}
    dn_sig = {"act_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32",
              "part_ptr": "*fp32", "cnt_ptr": "*i32", "out_ptr": "*bf16", "E": "i32",
              "H": "i32", "I": "i32", "S": "i32", "NB": "i32", "stride_as": "i32",
              "stride_we": "i32", "stride_wn": "i32", "stride_ot": "i32", "UNITS": "i32",
              "P": "i32"}
    up = dict(KT=2048 // c.up_k, SP=8, TOP_K=8, GELU=False, BLOCK_N=c.up_n, BLOCK_K=c.up_k,
              EVEN_K=True, PDL=False)
    dn = dict(KT=768 // c.down_k, SP=8, TOP_K=8, BLOCK_N=c.down_n, BLOCK_K=c.down_k, EVEN_K=True,
              PDL=False, PREFETCH=0)
    up_al = ("stride_xt", "stride_we", "stride_wn", "stride_as")
    dn_al = ("H", "stride_as", "stride_we", "stride_wn", "stride_ot")
    nvidia = ("sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
    return [
        CompileCase(persist_gate_up_kernel, up_sig, up, num_warps=c.up_warps,
                    num_stages=c.up_stages, uses_dot=True, narrow_dot=True,
                    label="direct_persist_gate_up", aligned=up_al),
        CompileCase(persist_gate_up_kernel, up_sig, dict(up, PDL=True), num_warps=c.up_warps,
                    num_stages=c.up_stages, uses_dot=True, narrow_dot=True,
                    label="direct_persist_gate_up_pdl", targets=pdl.TARGETS, aligned=up_al),
        CompileCase(persist_down_kernel, dn_sig, dict(dn, ASM_SYNC=True),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_persist_down", targets=nvidia,
                    aligned=dn_al),
        CompileCase(persist_down_kernel, dn_sig, dict(dn, ASM_SYNC=True, PDL=True),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_persist_down_pdl", targets=pdl.TARGETS,
                    aligned=dn_al),
        CompileCase(persist_down_kernel, dn_sig, dict(dn, ASM_SYNC=True, PDL=True,
                                                      PREFETCH=2),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_persist_down_pdl_prefetch2",
                    targets=pdl.TARGETS, aligned=dn_al),
        CompileCase(persist_down_kernel, dn_sig, dict(dn, ASM_SYNC=False),
                    num_warps=c.down_warps, num_stages=c.down_stages, uses_dot=True,
                    narrow_dot=True, label="direct_persist_down_amd",
                    targets=("gfx942", "gfx950"), aligned=dn_al),
    ]
