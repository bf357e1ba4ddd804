"""L2 prefetch of a later kernel's weights while the memory bus idles (NVIDIA).

At B = 1 a decode layer alternates weight-streaming gemvs with small kernels (RoPE + K/V
store, the attention decode and its merge, norms) that move almost no bytes; while those run
the HBM idles. `prefetch_async(w)` forks a branch off the current stream that asks L2 for the
lines of `w` (`prefetch.global.L2`: no registers, nothing to wait for) and returns a handle
whose `join()` makes the current stream wait for that branch; the small kernels run beside it
on the main stream, and the gemv after `join()` then reads its weights from L2. Inside CUDA
graph capture the branch is a parallel node of the graph (a side stream forked and joined by
events, as capture requires).

Only the whole of a matrix or its first columns per K split (`cols`, `k_split`: the lines the
streaming gemv's programs read first) are asked for; the caller keeps what it asks for under
the L2 size. Weights are never written by a kernel of a step, so a prefetch is never stale.
On other devices (the interpreter, CPU, ROCm) `prefetch_async` launches nothing and `join()`
does nothing: the prefetch changes timing only, never a value.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...compile import CompileCase
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .pdl import prefetch_l2, supported

LINE = 128  # bytes per L2 line asked for
BLOCK_ROWS = 16


@triton.jit
def _prefetch_kernel(w_ptr, N, COLS, K_SPLIT, stride_w,
                     BR: tl.constexpr, LINES: tl.constexpr, LINE_ELEMS: tl.constexpr):
    """Rows [pid0 * BR, +BR) of w [N, *], columns [pid1 * K_SPLIT, + COLS) (COLS <= K_SPLIT,
    clipped by the caller to the matrix): one prefetch per 128-byte line."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    c0 = tl.program_id(1) * K_SPLIT
    cols = tl.arange(0, LINES) * LINE_ELEMS
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_w + (c0 + cols)[None, :]
    prefetch_l2(ptrs, (rows < N)[:, None] & (cols < COLS)[None, :])


@triton.jit
def _bulk_prefetch_kernel(w_ptr, NBYTES, CHUNK: tl.constexpr, PDL: tl.constexpr,
                          EARLY: tl.constexpr):
    """The NBYTES bytes at w_ptr (16-byte aligned, a multiple of 16) into L2, one
    cp.async.bulk.prefetch.L2 of CHUNK bytes per thread (sm_90+). PDL: a chained launch that
    triggers its dependents at once, waits for its predecessor (before the prefetches, or after
    them with EARLY) and so completes only after it, keeping the chain's order."""
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    off = (tl.program_id(0) * 32 + tl.arange(0, 32)).to(tl.int64) * CHUNK
    size = tl.minimum(NBYTES - off, CHUNK).to(tl.int32)
    ptrs = w_ptr.to(tl.pointer_type(tl.int8)) + off
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)
    if PDL and EARLY:
        gdc_wait()


BULK_CHUNK = 32768


def launch_bulk(w: torch.Tensor, early: bool = False) -> None:
    """The whole of contiguous w into L2 as a chained launch on the current stream (see
    _bulk_prefetch_kernel); NVIDIA sm_90+ only."""
    if not w.is_contiguous() or w.data_ptr() % 16 or (w.numel() * w.element_size()) % 16:
        raise ValueError("l2 bulk prefetch: a contiguous tensor, 16-byte aligned and sized")
    nbytes = w.numel() * w.element_size()
    _bulk_prefetch_kernel[(triton.cdiv(nbytes, 32 * BULK_CHUNK),)](
        w, nbytes, CHUNK=BULK_CHUNK, PDL=True, EARLY=early, num_warps=1, launch_pdl=True)


def _plan(w: torch.Tensor, cols: int | None, k_split: int | None) -> tuple:
    if w.dim() != 2 or w.stride(1) != 1:
        raise ValueError(f"l2 prefetch: a 2-D weight with unit column stride, got shape "
                         f"{tuple(w.shape)} strides {w.stride()}")
    n, k = w.shape
    k_split = k if k_split is None else int(k_split)
    cols = k_split if cols is None else int(cols)
    if k_split <= 0 or cols <= 0:
        raise ValueError(f"l2 prefetch: cols ({cols}) and k_split ({k_split}) must be > 0")
    cols = min(cols, k_split, k)
    line_elems = max(1, LINE // w.element_size())
    lines = triton.next_power_of_2(triton.cdiv(cols, line_elems))
    return n, cols, k_split, triton.cdiv(k, k_split), line_elems, lines


def nbytes(w: torch.Tensor, cols: int | None = None, k_split: int | None = None) -> int:
    """Bytes `prefetch_async` asks L2 for (whole lines)."""
    n, cols, _, splits, line_elems, _ = _plan(w, cols, k_split)
    return n * splits * triton.cdiv(cols, line_elems) * LINE


def launch(w: torch.Tensor, cols: int | None = None, k_split: int | None = None) -> None:
    """The prefetch launch itself, on the current stream (callers wanting it beside other work
    use prefetch_async)."""
    n, cols, k_split, splits, line_elems, lines = _plan(w, cols, k_split)
    _prefetch_kernel[(triton.cdiv(n, BLOCK_ROWS), splits)](
        w, n, cols, k_split, w.stride(0), BR=BLOCK_ROWS, LINES=lines, LINE_ELEMS=line_elems,
        num_warps=4)


class _Join:
    __slots__ = ("event", "device")

    def __init__(self, event=None, device=None):
        self.event, self.device = event, device

    def join(self) -> None:
        """The current stream waits for the prefetch branch (no-op when nothing launched)."""
        if self.event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.event)
            self.event = None


_side: dict[torch.device, torch.cuda.Stream] = {}


def no_join() -> _Join:
    """A handle whose join() does nothing (nothing was forked)."""
    return _Join()


def available(device: torch.device) -> bool:
    """Whether prefetch_async launches anything on `device` (NVIDIA sm_90+ CUDA)."""
    return supported(device)


def prefetch_async(w: torch.Tensor, cols: int | None = None,
                   k_split: int | None = None) -> _Join:
    """Fork a branch off the current stream that prefetches `w` (see the module doc) and
    return its join handle. The branch starts after everything already on the current stream
    (so it does not compete with the kernel in flight) and runs beside what comes next."""
    if not available(w.device):
        return _Join()
    _plan(w, cols, k_split)  # validate before forking
    main = torch.cuda.current_stream(w.device)
    side = _side.get(w.device)
    if side is None:
        side = _side[w.device] = torch.cuda.Stream(w.device)
    fork = torch.cuda.Event()
    fork.record(main)
    side.wait_event(fork)
    with torch.cuda.stream(side):
        launch(w, cols, k_split)
    done = torch.cuda.Event()
    done.record(side)
    return _Join(done, w.device)


def compile_cases() -> list[CompileCase]:
    sig = {"w_ptr": "*bf16", "N": "i32", "COLS": "i32", "K_SPLIT": "i32", "stride_w": "i32"}
    return [CompileCase(_prefetch_kernel, sig,
                        dict(BR=BLOCK_ROWS, LINES=64, LINE_ELEMS=64), num_warps=4,
                        aligned=("N", "COLS", "K_SPLIT", "stride_w"),
                        targets=("sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
                        label="bf16 rows x 64 lines"),
            CompileCase(_bulk_prefetch_kernel, {"w_ptr": "*bf16", "NBYTES": "i64"},
                        dict(CHUNK=BULK_CHUNK, PDL=True, EARLY=False), num_warps=1,
                        targets=("sm_90", "sm_100", "sm_120"), label="bulk pdl")]
