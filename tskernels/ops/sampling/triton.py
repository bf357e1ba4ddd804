"""Triton sampling kernels: greedy argmax over a large vocabulary (split-V, two stages).

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


def _chunk(batch: int, vocab: int) -> int:
    """Chunk length: large enough that a program streams tens of KB, small enough that the
    grid still covers every SM a few times over at small batches."""
    chunk = 16384
    while chunk > _BLOCK and batch * triton.cdiv(vocab, chunk) < 1024:
        chunk //= 2
    return chunk


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row argmax of logits [B, V] (last dim contiguous) -> int64 [B]; no host sync."""
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device) if out is None else out
    if batch == 0:
        return out
    chunk = _chunk(batch, vocab)
    n_chunks = triton.cdiv(vocab, chunk)
    dev = logits.device
    val = torch.empty(batch, n_chunks, dtype=torch.float32, device=dev)
    idx = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    nan = torch.empty(batch, n_chunks, dtype=torch.int32, device=dev)
    _argmax_chunk[(batch, n_chunks)](logits, val, idx, nan, vocab, logits.stride(0), n_chunks,
                                     CHUNK=chunk, BLOCK=min(_BLOCK, chunk), num_warps=8)
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
            CompileCase(_argmax_final, fin, dict(BLOCK_S=128), num_warps=1)]


@register("sampling", "greedy", **TRITON, formats=FORMATS, tags=("deterministic",),
          compile_cases=_greedy_cases)
def greedy(logits):
    """Triton split-V argmax (two stages), equal to torch.argmax incl. ties and NaN."""
    return argmax(logits)
