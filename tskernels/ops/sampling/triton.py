"""Triton sampling kernels: greedy argmax over a large vocabulary (split-V).

Default "two_stage": partials, then a reduction launch. "ticket" (one launch: each (row,
chunk) program loads its whole chunk at once and the row's last program to arrive reduces the
partials) measured slower on the H200 (B=64: 17.5-23.4 us over its chunk / warps sweep vs
14.6; benchmarks/RESULTS.md, issue 23), so it is kept for sweeps only. "loop_ticket" (the
two-stage load loop with the ticket epilogue) is 4-6 % faster than two_stage (B=256: 43.97
vs 46.53 us at chunk 8192 / block 1024 / 8 warps), but both ticket variants share per-device
arrival counters across calls, so launches on two streams of one device at once would
corrupt them: they are opt-in, and two_stage (no shared state) stays the default.
Two variants without shared state, to be timed against it (benchmarks/s16_greedy_gpu.py):
"two_stage_pdl" launches the same kernels as programmatic dependents (sm_90+: the final
reduction's launch and prologue overlap the partials' tail), and "balanced" sizes the grid to
whole waves of programs (B x S <= per_sm x waves x SMs), streams each chunk in [rows, N] tiles
of 16-byte evict-first loads and keeps (value, index) partials (NaN as a value), PDL too.
Stage 1 gives each (row, chunk) program CHUNK logits; every lane keeps the first maximum it
sees (strict >), so one reduction at the end gives the chunk's lowest-index maximum. Stage 2
reduces a row's chunk partials. NaN wins like in torch.argmax (first NaN index), -0.0 == 0.0,
so the result equals torch.argmax bit for bit. The chunk size may depend on the batch (max and
min are exact), so small batches still spread over the SMs.
The stochastic sampler and the penalties kernel live in triton_sample.py / triton_penalties.py.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...compile import CompileCase
from ...platform import platform_of
from ...registry import register
from .._common import TRITON
from . import _tune
from . import triton_penalties, triton_sample  # noqa: F401  (register backends)

FORMATS = {"logits": ("fp32", "fp16", "bf16")}
BIG = 2**31 - 1
_BLOCK = 2048


@triton.jit
def _argmax_chunk(x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride, S,
                  CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Partial of one (row, chunk): lowest-index max (NaN skipped) and first NaN index."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    base = x_ptr + row.to(tl.int64) * stride
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 2147483647, tl.int32)
    nan_i = tl.full([BLOCK], 2147483647, tl.int32)
    for off in range(0, CHUNK, BLOCK):
        cols = c * CHUNK + off + lanes
        valid = cols < V
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        isnan = x != x
        take = valid & (x == x) & ((x > best_v) | (best_i == 2147483647))
        best_v = tl.where(take, x, best_v)
        best_i = tl.where(take, cols, best_i)
        nan_i = tl.minimum(nan_i, tl.where(isnan & valid, cols, 2147483647))
    m = tl.max(best_v, axis=0)
    i = tl.min(tl.where((best_v == m) & (best_i < 2147483647), best_i, 2147483647), axis=0)
    out = row * S + c
    tl.store(val_ptr + out, m)
    tl.store(idx_ptr + out, i)
    tl.store(nan_ptr + out, tl.min(nan_i, axis=0))


@triton.jit
def _argmax_final(val_ptr, idx_ptr, nan_ptr, out_ptr, S, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    ok = s < S
    v = tl.load(val_ptr + row * S + s, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + row * S + s, mask=ok, other=2147483647)
    n = tl.min(tl.load(nan_ptr + row * S + s, mask=ok, other=2147483647), axis=0)
    m = tl.max(v, axis=0)
    best = tl.min(tl.where((v == m) & (i < 2147483647), i, 2147483647), axis=0)
    tl.store(out_ptr + row, tl.where(n < 2147483647, n, best).to(tl.int64))


@triton.jit
def _argmax_chunk_pdl(x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride, S,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """_argmax_chunk for two_stage_pdl: lets its dependent (_argmax_final_pdl) launch at once
    and, when itself launched as one, waits for the previous kernel before any load or store.
    A dependent launches only once every program of this grid is resident or done, so it
    never takes a slot this grid still needs. (Wrappers: the tuned tables key on the plain
    kernels' source, which stays as it was.)"""
    gdc_launch_dependents()
    gdc_wait()
    _argmax_chunk(x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride, S, CHUNK, BLOCK)


@triton.jit
def _argmax_final_pdl(val_ptr, idx_ptr, nan_ptr, out_ptr, S, BLOCK_S: tl.constexpr):
    """_argmax_final launched while _argmax_chunk_pdl drains: waits for its partials."""
    gdc_launch_dependents()
    gdc_wait()
    _argmax_final(val_ptr, idx_ptr, nan_ptr, out_ptr, S, BLOCK_S)


@triton.jit
def _ticket_reduce(val_ptr, idx_ptr, nan_ptr, cnt_ptr, out_ptr, row, S,
                   BLOCK_S: tl.constexpr):
    """The one-launch epilogue: count this (row, chunk) program in; the row's last program
    reduces the S partials into out[row] and re-arms the counter. Every thread's partial
    stores complete before one release-add counts this program in; the acquiring last
    program reads the others' partials past L1 (.cg)."""
    tl.debug_barrier()
    done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
    if done == S - 1:
        tl.store(cnt_ptr + row, 0)  # re-armed for the next launch (stream-ordered)
        s = tl.arange(0, BLOCK_S)
        ok = s < S
        v = tl.load(val_ptr + row * S + s, mask=ok, other=float("-inf"), cache_modifier=".cg")
        i = tl.load(idx_ptr + row * S + s, mask=ok, other=2147483647, cache_modifier=".cg")
        n = tl.min(tl.load(nan_ptr + row * S + s, mask=ok, other=2147483647,
                           cache_modifier=".cg"), axis=0)
        best_v = tl.max(v, axis=0)
        best = tl.min(tl.where((v == best_v) & (i < 2147483647), i, 2147483647), axis=0)
        tl.store(out_ptr + row, tl.where(n < 2147483647, n, best).to(tl.int64))


@triton.jit
def _argmax_ticket(x_ptr, val_ptr, idx_ptr, nan_ptr, cnt_ptr, out_ptr, V, stride, S,
                   CHUNK: tl.constexpr, BLOCK_S: tl.constexpr):
    """One launch: a (row, chunk) program reads its whole chunk in one go (every load in
    flight at once), writes its partial, and the row's last program to arrive (atomic
    ticket) reduces the row and re-arms the counter."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    valid = cols < V
    x = tl.load(x_ptr + row.to(tl.int64) * stride + cols, mask=valid,
                other=float("-inf")).to(tl.float32)
    num = valid & (x == x)
    xv = tl.where(num, x, float("-inf"))
    m = tl.max(xv, axis=0)
    out = row * S + c
    tl.store(val_ptr + out, m)
    tl.store(idx_ptr + out, tl.min(tl.where(num & (xv == m), cols, 2147483647), axis=0))
    tl.store(nan_ptr + out, tl.min(tl.where(valid & (x != x), cols, 2147483647), axis=0))
    _ticket_reduce(val_ptr, idx_ptr, nan_ptr, cnt_ptr, out_ptr, row, S, BLOCK_S)


@triton.jit
def _argmax_loop_ticket(x_ptr, val_ptr, idx_ptr, nan_ptr, cnt_ptr, out_ptr, V, stride, S,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """One launch: _argmax_chunk's loop of BLOCK-wide loads (few registers, many programs
    resident), then the ticket epilogue of _argmax_ticket (the row's last program reduces)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    base = x_ptr + row.to(tl.int64) * stride
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 2147483647, tl.int32)
    nan_i = tl.full([BLOCK], 2147483647, tl.int32)
    for off in range(0, CHUNK, BLOCK):
        cols = c * CHUNK + off + lanes
        valid = cols < V
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        take = valid & (x == x) & ((x > best_v) | (best_i == 2147483647))
        best_v = tl.where(take, x, best_v)
        best_i = tl.where(take, cols, best_i)
        nan_i = tl.minimum(nan_i, tl.where((x != x) & valid, cols, 2147483647))
    m = tl.max(best_v, axis=0)
    out = row * S + c
    tl.store(val_ptr + out, m)
    tl.store(idx_ptr + out, tl.min(tl.where((best_v == m) & (best_i < 2147483647), best_i,
                                            2147483647), axis=0))
    tl.store(nan_ptr + out, tl.min(nan_i, axis=0))
    _ticket_reduce(val_ptr, idx_ptr, nan_ptr, cnt_ptr, out_ptr, row, S, BLOCK_S)


@triton.jit
def _argmax_part(x_ptr, val_ptr, idx_ptr, V, stride, S, CHUNK,
                 N: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr,
                 PDL: tl.constexpr):
    """Partial of (row, chunk) = divmod(program, S) over logits [CHUNK * c, + CHUNK): the
    first maximum (value, index), or (NaN, first NaN index) when the chunk holds a NaN.
    A loop step loads a [ROWS, N] tile (ROWS 16-byte loads per thread, all in flight
    together: the row-wise max needs every one) and folds it into one N-wide state: per lane
    the tile's max and the first row holding it, taken only when strictly greater, so each
    lane keeps its first maximum with 2 registers of state, not 2 per loaded logit. A NaN
    only turns its lane's value to NaN (a flag, no third register): a chunk with one re-reads
    itself for the first NaN (rare, off the hot path). A lane left at BIG saw only -inf:
    the chunk's first index wins then."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    row = pid // S
    start = (pid - row * S) * CHUNK
    end = tl.minimum(start + CHUNK, V)
    base = x_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, N)
    rows = tl.arange(0, ROWS)
    tile = rows[:, None] * N + lanes[None, :]
    best_v = tl.full([N], float("-inf"), tl.float32)
    best_i = tl.full([N], 2147483647, tl.int32)
    for off in range(start, end, ROWS * N):
        x = tl.load(base + off + tile, mask=off + tile < end, other=float("-inf"),
                    eviction_policy="evict_first" if EVICT else "").to(tl.float32)
        tmax = tl.max(x, axis=0)
        first = tl.min(tl.where(x == tmax[None, :], rows[:, None], ROWS), axis=0)
        # a lane that meets a NaN keeps NaN as its value (nothing is > NaN): the flag
        nan = tl.max((x != x).to(tl.int32), axis=0) > 0
        take = (tmax > best_v) | nan
        best_v = tl.where(take, tl.where(nan, float("nan"), tmax), best_v)
        best_i = tl.where(take, off + first * N + lanes, best_i)
    lane_nan = best_v != best_v
    m = tl.max(tl.where(lane_nan, float("-inf"), best_v), axis=0)
    i = tl.min(tl.where(best_v == m, best_i, 2147483647), axis=0)
    i = tl.where(i == 2147483647, start, i)
    first_nan = 2147483647
    if tl.max(lane_nan.to(tl.int32), axis=0) > 0:
        for off in range(start, end, N):
            cols = off + lanes
            x = tl.load(base + cols, mask=cols < end, other=0.0)
            first_nan = tl.minimum(first_nan, tl.min(tl.where(x != x, cols, 2147483647), 0))
    tl.store(val_ptr + pid, tl.where(first_nan < 2147483647, float("nan"), m))
    tl.store(idx_ptr + pid, tl.where(first_nan < 2147483647, first_nan, i))


@triton.jit
def _argmax_merge(val_ptr, idx_ptr, out_ptr, S, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """out[row] from its S (value, index) partials: the first NaN partial's index, else the
    lowest index of the maximum (an all -inf chunk's partial is its first index)."""
    if PDL:  # launched while _argmax_part drains: wait for its partials
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    ok = s < S
    v = tl.load(val_ptr + row * S + s, mask=ok, other=float("-inf"), cache_modifier=".cg")
    i = tl.load(idx_ptr + row * S + s, mask=ok, other=2147483647, cache_modifier=".cg")
    first_nan = tl.min(tl.where(v != v, i, 2147483647), axis=0)
    m = tl.max(tl.where(v != v, float("-inf"), v), axis=0)
    best = tl.min(tl.where(v == m, i, 2147483647), axis=0)
    tl.store(out_ptr + row, tl.where(first_nan < 2147483647, first_nan, best).to(tl.int64))


_counters: dict[torch.device, torch.Tensor] = {}


def _ticket_counters(device: torch.device, batch: int) -> torch.Tensor:
    """Per-row arrival counters of the device, zeroed once and re-armed by the kernel; a
    bigger batch gets a fresh zeroed buffer. Calls on one device share them, so they are
    stream-ordered like the kernels' other workspaces; the first call should run eagerly
    (outside graph capture), as an engine's warm-up does."""
    cnt = _counters.get(device)
    if cnt is None or cnt.numel() < batch:
        cnt = _counters[device] = torch.zeros(max(batch, 1024), dtype=torch.int32,
                                              device=device)
    return cnt


def _ticket_chunk(batch: int, vocab: int) -> int:
    """Whole-chunk loads of 4096 logits (16 KB of fp32) per program, halved down to 1024
    while the grid would leave SMs idle (fewer than two programs per SM of an H200)."""
    chunk = 4096
    while chunk > 1024 and batch * triton.cdiv(vocab, chunk) < 264:
        chunk //= 2
    return chunk


def _chunk(batch: int, vocab: int) -> int:
    """Chunk length: large enough that a program streams tens of KB, small enough that the
    grid still covers every SM a few times over at small batches."""
    chunk = 16384
    while chunk > _BLOCK and batch * triton.cdiv(vocab, chunk) < 1024:
        chunk //= 2
    return chunk


PDL_MODES = ("none", "final", "both")


@dataclasses.dataclass(frozen=True)
class Balanced:
    """Launch of the "balanced" argmax (_argmax_part + _argmax_merge).

    per_sm x waves x SMs programs at most (B rows x S chunks, S the largest that fits, so the
    grid is whole waves when per_sm is the kernel's occupancy), each streaming one contiguous
    chunk of its row; rows: 16-byte loads per thread in flight per loop step; evict_first:
    the one-pass read asks L2 to drop its lines first; pdl: "final" launches _argmax_merge as
    a programmatic dependent (its launch and prologue under the partials' tail), "both" also
    _argmax_part (under whatever kernel precedes it); ignored below sm_90 / off NVIDIA.
    chunks: S itself (0: the rule above), for tests and sweeps."""

    per_sm: int = 4
    waves: int = 1
    rows: int = 4
    num_warps: int = 8
    evict_first: bool = True
    pdl: str = "both"
    chunks: int = 0

    def __post_init__(self):
        if self.pdl not in PDL_MODES:
            raise ValueError(f"pdl: expected one of {PDL_MODES}, got {self.pdl!r}")
        if min(self.per_sm, self.waves, self.rows, self.num_warps) < 1 or self.chunks < 0:
            raise ValueError(f"Balanced: every count must be positive, got {self}")
        if self.rows & (self.rows - 1) or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"Balanced: rows and num_warps must be powers of two, got {self}")


VARIANTS = ("ticket", "two_stage", "loop_ticket", "two_stage_pdl", "balanced")
# The default: "balanced" at 4 warps x 10 programs per SM, the fastest measured on the H200 at
# B = 1 / 64 / 256 fp32 and B = 64 bf16 (fp32 B = 64: 12.2 us vs two_stage 15.0, B = 256:
# 38.3 vs 47.0; benchmarks/RESULTS.md, "Session 16"). Free of state shared across calls
# (per-call partials from the caching allocator, like two_stage).
VARIANT = "balanced"
BALANCED = Balanced(per_sm=10, num_warps=4)


def _pdl_ok(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA sm_90+ (the platform is cached per device)."""
    if device.type != "cuda":
        return False
    plat = platform_of(device)
    return plat.vendor == "nvidia" and plat.arch >= 90


def balanced_split(batch: int, vocab: int, tile: int, sms: int, cfg: Balanced):
    """(S chunks per row, chunk length): S = the most chunks with batch x S <= per_sm x waves
    x sms (cfg.chunks when set), at most one per `tile` logits; chunks are multiples of 16
    logits (16-byte aligned starts for every dtype) and none is empty."""
    s = cfg.chunks or max(1, sms * cfg.per_sm * cfg.waves // batch)
    s = max(1, min(s, triton.cdiv(vocab, tile)))
    chunk = triton.cdiv(triton.cdiv(vocab, s), 16) * 16
    return triton.cdiv(vocab, chunk), chunk


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None, *,
           variant: str | None = None, chunk: int | None = None, block: int | None = None,
           num_warps: int = 8, pdl: str = "both",
           balanced: Balanced | None = None) -> torch.Tensor:
    """Row argmax of logits [B, V] (last dim contiguous) -> int64 [B]; no host sync.
    variant: "ticket" (one launch, last program of a row reduces), "two_stage" (partials,
    then a reduction launch), "loop_ticket" (two_stage's load loop with the ticket
    epilogue: one launch), "two_stage_pdl" (two_stage launched as programmatic dependents:
    pdl "final" or "both", see Balanced) or "balanced" (whole-wave grid, `balanced` or
    BALANCED); chunk / block / num_warps override the one-launch variants' launch (powers
    of two, for sweeps)."""
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device) if out is None else out
    if batch == 0:
        return out
    variant = variant or VARIANT
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    if variant == "balanced":
        return _balanced(logits, out, balanced or BALANCED)
    if variant == "ticket":
        chunk = min(chunk or _ticket_chunk(batch, vocab), max(128, triton.next_power_of_2(vocab)))
        n_chunks = triton.cdiv(vocab, chunk)
        dev = logits.device
        val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
        idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
        nan = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
        _argmax_ticket[(batch, n_chunks)](logits, val, idx, nan, _ticket_counters(dev, batch),
                                          out, vocab, logits.stride(0), n_chunks, CHUNK=chunk,
                                          BLOCK_S=max(16, triton.next_power_of_2(n_chunks)),
                                          num_warps=num_warps)
        return out
    if variant == "loop_ticket":
        chunk = chunk or _chunk(batch, vocab)
        block = min(block or _BLOCK, chunk)
        n_chunks = triton.cdiv(vocab, chunk)
        dev = logits.device
        val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
        idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
        nan = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
        _argmax_loop_ticket[(batch, n_chunks)](
            logits, val, idx, nan, _ticket_counters(dev, batch), out, vocab, logits.stride(0),
            n_chunks, CHUNK=chunk, BLOCK=block,
            BLOCK_S=max(16, triton.next_power_of_2(n_chunks)), num_warps=num_warps)
        return out
    if pdl not in PDL_MODES:
        raise ValueError(f"pdl: expected one of {PDL_MODES}, got {pdl!r}")
    dev = logits.device
    mode = pdl if variant == "two_stage_pdl" and _pdl_ok(dev) else "none"
    tcfg = _tune.greedy_config(batch, vocab, logits.dtype, dev)
    chunk = tcfg["chunk"] or _chunk(batch, vocab)
    n_chunks = triton.cdiv(vocab, chunk)
    val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
    idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    nan = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    pdl_on = mode != "none"
    (_argmax_chunk_pdl if pdl_on else _argmax_chunk)[(batch, n_chunks)](
        logits, val, idx, nan, vocab, logits.stride(0), n_chunks, CHUNK=chunk,
        BLOCK=min(tcfg["block"], chunk), num_warps=tcfg["num_warps"], **_launch(mode, True))
    (_argmax_final_pdl if pdl_on else _argmax_final)[(batch,)](
        val, idx, nan, out, n_chunks, BLOCK_S=max(16, triton.next_power_of_2(n_chunks)),
        num_warps=1, **_launch(mode, False))
    return out


def _launch(mode: str, first: bool) -> dict:
    """The launch option of one stage under a pdl mode: a programmatic dependent launch for
    the final stage, and for the first one too under "both". (The first stage's griddepcontrol
    code is there whenever PDL is on: launched plainly, it still lets its dependent launch
    early, and its wait returns at once.)"""
    return {"launch_pdl": True} if mode == "both" or (mode == "final" and not first) else {}


def _balanced(logits: torch.Tensor, out: torch.Tensor, cfg: Balanced) -> torch.Tensor:
    batch, vocab = logits.shape
    dev = logits.device
    mode = cfg.pdl if _pdl_ok(dev) else "none"
    lanes = cfg.num_warps * 32 * (16 // logits.element_size())  # one 16-byte load a thread
    sms = platform_of(dev).num_sms if dev.type == "cuda" else 2
    n_chunks, chunk = balanced_split(batch, vocab, cfg.rows * lanes, sms, cfg)
    val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
    idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    _argmax_part[(batch * n_chunks,)](logits, val, idx, vocab, logits.stride(0), n_chunks,
                                      chunk, N=lanes, ROWS=cfg.rows, EVICT=cfg.evict_first,
                                      PDL=mode != "none", num_warps=cfg.num_warps,
                                      **_launch(mode, True))
    _argmax_merge[(batch,)](val, idx, out, n_chunks,
                            BLOCK_S=max(16, triton.next_power_of_2(n_chunks)),
                            PDL=mode != "none", num_warps=1, **_launch(mode, False))
    return out


def _greedy_cases():
    sig = {"x_ptr": "*fp32", "val_ptr": "*fp32", "idx_ptr": "*i32", "nan_ptr": "*i32",
           "V": "i32", "stride": "i32", "S": "i32"}
    fin = {"val_ptr": "*fp32", "idx_ptr": "*i32", "nan_ptr": "*i32", "out_ptr": "*i64",
           "S": "i32"}
    return [CompileCase(_argmax_chunk, sig, dict(CHUNK=16384, BLOCK=_BLOCK), num_warps=8),
            CompileCase(_argmax_chunk, dict(sig, x_ptr="*bf16"), dict(CHUNK=4096, BLOCK=_BLOCK),
                        num_warps=8, label="bf16"),
            CompileCase(_argmax_final, fin, dict(BLOCK_S=128), num_warps=1),
            CompileCase(_argmax_ticket, dict(sig, cnt_ptr="*i32", out_ptr="*i64"),
                        dict(CHUNK=4096, BLOCK_S=64), num_warps=8, label="ticket"),
            CompileCase(_argmax_ticket, dict(sig, x_ptr="*bf16", cnt_ptr="*i32",
                                             out_ptr="*i64"),
                        dict(CHUNK=8192, BLOCK_S=32), num_warps=8, label="ticket_bf16"),
            CompileCase(_argmax_loop_ticket, dict(sig, cnt_ptr="*i32", out_ptr="*i64"),
                        dict(CHUNK=8192, BLOCK=_BLOCK, BLOCK_S=32), num_warps=8,
                        label="loop_ticket"),
            # two_stage_pdl: the same kernels behind griddepcontrol (sm_90+ only)
            CompileCase(_argmax_chunk_pdl, sig, dict(CHUNK=8192, BLOCK=_BLOCK), num_warps=8,
                        targets=_PDL_TARGETS),
            CompileCase(_argmax_final_pdl, fin, dict(BLOCK_S=32), num_warps=1,
                        targets=_PDL_TARGETS)] + _balanced_cases()


_PDL_TARGETS = ("sm_90", "sm_100", "sm_120")


def _balanced_cases():
    """_argmax_part / _argmax_merge as BALANCED launches them (V, stride and the chunk are
    multiples of 16 at V = 151,936, which the JIT specialises on)."""
    sig = {"x_ptr": "*fp32", "val_ptr": "*fp32", "idx_ptr": "*i32", "V": "i32",
           "stride": "i32", "S": "i32", "CHUNK": "i32"}
    aligned = ("V", "stride", "CHUNK")
    cfg = BALANCED
    part = dict(ROWS=cfg.rows, EVICT=cfg.evict_first, PDL=False)
    lanes = cfg.num_warps * 32 * 4
    merge = {"val_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "S": "i32"}
    return [CompileCase(_argmax_part, sig, dict(part, N=lanes), num_warps=cfg.num_warps,
                        aligned=aligned),
            CompileCase(_argmax_part, dict(sig, x_ptr="*bf16"), dict(part, N=2 * lanes),
                        num_warps=cfg.num_warps, aligned=aligned, label="bf16"),
            CompileCase(_argmax_part, sig, dict(part, N=lanes, PDL=True),
                        num_warps=cfg.num_warps, aligned=aligned, label="pdl",
                        targets=_PDL_TARGETS),
            CompileCase(_argmax_merge, merge, dict(BLOCK_S=16, PDL=False), num_warps=1),
            CompileCase(_argmax_merge, merge, dict(BLOCK_S=16, PDL=True), num_warps=1,
                        label="pdl", targets=_PDL_TARGETS)]


@register("sampling", "greedy", **TRITON, formats=FORMATS, tags=("deterministic",),
          compile_cases=_greedy_cases)
def greedy(logits):
    """Triton split-V argmax, equal to torch.argmax incl. ties and NaN."""
    return argmax(logits)
