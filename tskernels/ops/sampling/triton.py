"""Triton sampling kernels: greedy argmax over a large vocabulary (split-V).

Default "two_stage": partials, then a reduction launch. "ticket" (one launch: each (row,
chunk) program loads its whole chunk at once and the row's last program to arrive reduces the
partials) measured slower on the H200 (B=64: 17.5-23.4 us over its chunk / warps sweep vs
14.6; benchmarks/RESULTS.md, issue 23), so it is kept for sweeps only. "loop_ticket" (the
two-stage load loop with the ticket epilogue) is 4-6 % faster than two_stage (B=256: 43.97
vs 46.53 us at chunk 8192 / block 1024 / 8 warps), but both ticket variants share per-device
arrival counters across calls, so launches on two streams of one device at once would
corrupt them: they are opt-in, and two_stage (no shared state) stays the default.
Stage 1 gives each (row, chunk) program CHUNK logits; every lane keeps the first maximum it
sees (strict >), so one reduction at the end gives the chunk's lowest-index maximum. Stage 2
reduces a row's chunk partials. NaN wins like in torch.argmax (first NaN index), -0.0 == 0.0,
so the result equals torch.argmax bit for bit. The chunk size may depend on the batch (max and
min are exact), so small batches still spread over the SMs.
The stochastic sampler and the penalties kernel live in triton_sample.py / triton_penalties.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
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


VARIANTS = ("ticket", "two_stage", "loop_ticket")
VARIANT = "two_stage"


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None, *,
           variant: str | None = None, chunk: int | None = None, block: int | None = None,
           num_warps: int = 8) -> torch.Tensor:
    """Row argmax of logits [B, V] (last dim contiguous) -> int64 [B]; no host sync.
    variant: "ticket" (one launch, last program of a row reduces), "two_stage" (partials,
    then a reduction launch) or "loop_ticket" (two_stage's load loop with the ticket
    epilogue: one launch); chunk / block / num_warps override the one-launch variants'
    launch (powers of two, for sweeps)."""
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device) if out is None else out
    if batch == 0:
        return out
    variant = variant or VARIANT
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
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
    tcfg = _tune.greedy_config(batch, vocab, logits.dtype, logits.device)
    chunk = tcfg["chunk"] or _chunk(batch, vocab)
    n_chunks = triton.cdiv(vocab, chunk)
    dev = logits.device
    val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
    idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    nan = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    _argmax_chunk[(batch, n_chunks)](logits, val, idx, nan, vocab, logits.stride(0), n_chunks,
                                     CHUNK=chunk, BLOCK=min(tcfg["block"], chunk),
                                     num_warps=tcfg["num_warps"])
    _argmax_final[(batch,)](val, idx, nan, out, n_chunks,
                            BLOCK_S=max(16, triton.next_power_of_2(n_chunks)), num_warps=1)
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
                        label="loop_ticket")]


@register("sampling", "greedy", **TRITON, formats=FORMATS, tags=("deterministic",),
          compile_cases=_greedy_cases)
def greedy(logits):
    """Triton split-V argmax, equal to torch.argmax incl. ties and NaN."""
    return argmax(logits)
