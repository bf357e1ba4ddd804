"""CPU graphs: record a step made of tskernels' C++ CPU kernels once, replay it without Python.

A CPU decode step of a small model is ~400 kernel calls of a few to a few hundred microseconds;
the Python between them (module calls, wrappers, allocations) costs as much as the kernels.
`CPUGraph` is the CPU's counterpart of a CUDA graph:

    g = tskernels.CPUGraph()
    with g.capture():
        out = step()          # runs once, for real, and is recorded
    ...                       # refresh the step's input tensors in place
    g.replay()                # the same calls on the same memory; `out` holds the new result

What a capture records:
- every call into `tskernels._cpu` made by this thread (the C++ kernels of the CPU backends:
  GEMMs, decode attention, K/V store, norms, SiLU, RoPE), with its raw pointers and sizes;
- every other torch op that computes (an embedding lookup, an argmax, a `.contiguous()` copy),
  as a Python call replayed in its place, its result copied into the tensor the capture made
  (so later kernels, which hold that tensor's address, read the new values);
- nothing for views and allocations: every tensor the step creates is kept alive with the
  graph, so the addresses the recorded calls hold stay theirs.

What it refuses (`CaptureError`, raised during the capture): an op whose result leaves the
tensor world (`.item()`, `bool(t)`, a value-dependent branch), since Python's decision would be
frozen at its capture value, and an op whose result shape depends on tensor values (`nonzero`,
`unique`, a boolean mask); at replay, an op whose result shape changed (an input resized). Host-side reads
that bypass torch's dispatcher (`.tolist()`, `.numpy()`) cannot be seen; steps captured here
must not branch on tensor values (the decode steps of serve's models do not; their parity tests
compare replays against eager steps).

A graph is bound to its tensors: shapes, pointers and the sequence of calls are fixed at
capture. Inputs change by writing into the captured input tensors in place.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CPUGraph", "CaptureError", "available"]


class CaptureError(RuntimeError):
    """The step cannot be recorded (see the module docstring)."""


def _ext():
    try:
        from . import _cpu
    except ImportError:
        return None
    return _cpu if hasattr(_cpu, "capture_begin") else None


def available() -> bool:
    """Whether the C++ extension (with capture support) is built."""
    return _ext() is not None


_ALLOC = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
          torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
          torch.ops.aten.new_empty_strided.default}


def _storages(tree) -> set[int]:
    flat, _ = tree_flatten(tree)
    return {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor)}


def _is_view(func, args, kwargs, out) -> bool:
    """A non-mutating op whose every result aliases an input: a view, split, detach, or a
    `to` / `reshape` / `contiguous` that had nothing to do. (Judged by the result: the same op
    copies when it must, and that copy is a computation to replay.)"""
    if func._schema.is_mutable:
        return False
    outs = _storages(out)
    return bool(outs) and outs <= _storages((args, kwargs))


def _integer_index(func, args) -> bool:
    """x[idx] with integer index tensors only: its shape is the indices' (a bool mask's is
    not)."""
    if func is not torch.ops.aten.index.Tensor:
        return False
    return all(i is None or not (i.dtype == torch.bool or i.dtype == torch.uint8)
               for i in args[1])


class _Recorder(TorchDispatchMode):
    """Keeps every tensor the step makes alive and records the torch ops that compute, each
    with the position in the C++ program it falls at."""

    def __init__(self, ext):
        super().__init__()
        self.ext = ext
        self.keep: list = []
        self.thunks: list[tuple[int, object, tuple, dict, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.data_dependent_output in func.tags:
            raise CaptureError(f"{func} returns a host value during a CPU graph capture: the "
                               f"step would branch on its capture-time value")
        if torch.Tag.dynamic_output_shape in func.tags and not _integer_index(func, args):
            raise CaptureError(f"{func}'s result shape depends on tensor values: a CPU graph "
                               f"cannot replay it")
        out = func(*args, **kwargs)
        self.keep.append(out)
        if func in _ALLOC or _is_view(func, args, kwargs, out):
            return out
        flat, _ = tree_flatten(out)
        if any(not isinstance(o, torch.Tensor) for o in flat if o is not None):
            raise CaptureError(f"{func} returns a host value during a CPU graph capture: the "
                               f"step would branch on its capture-time value")
        # a mutating op (in place, out=) is replayed as is; a functional one has its result
        # copied into the tensors the capture handed on
        result = None if func._schema.is_mutable else flat
        self.thunks.append((self.ext.capture_size(), func, args, kwargs, result))
        return out


class CPUGraph:
    """A recorded CPU step (see the module docstring). One capture per graph."""

    def __init__(self):
        self._program = None
        self._thunks: list = []
        self._keep: list = []
        self.replays = 0

    @contextlib.contextmanager
    def capture(self):
        """Run the body once for real while recording it. Raises CaptureError when the body
        does something a replay cannot repeat; the graph is then empty."""
        ext = _ext()
        if ext is None:
            raise CaptureError("tskernels._cpu (the C++ extension) is not built")
        if self._program is not None:
            raise CaptureError("this CPUGraph was already captured")
        rec = _Recorder(ext)
        ext.capture_begin()
        try:
            with torch.inference_mode(), rec:
                yield self
        except BaseException:
            ext.capture_abort()
            raise
        self._program = ext.capture_end()
        self._thunks, self._keep = rec.thunks, rec.keep

    @property
    def num_kernel_calls(self) -> int:
        return 0 if self._program is None else len(self._program)

    @property
    def num_torch_ops(self) -> int:
        """torch ops replayed from Python between the kernel calls."""
        return len(self._thunks)

    def replay(self) -> None:
        """Run the recorded calls again, in order, on the captured tensors."""
        prog = self._program
        if prog is None:
            raise RuntimeError("CPUGraph.replay: nothing captured")
        pos = 0
        with torch.inference_mode():
            for mark, func, args, kwargs, result in self._thunks:
                if mark > pos:
                    prog.replay(pos, mark)
                    pos = mark
                out = func(*args, **kwargs)
                if result is not None:
                    new, _ = tree_flatten(out)
                    for dst, src in zip(result, new):
                        if dst is None:
                            continue
                        if src.shape != dst.shape:
                            raise RuntimeError(f"CPUGraph.replay: {func} returned shape "
                                               f"{tuple(src.shape)}, captured "
                                               f"{tuple(dst.shape)}")
                        dst.copy_(src)
        prog.replay(pos)
        self.replays += 1

    def reset(self) -> None:
        """Drop the program and the tensors it holds."""
        self._program, self._thunks, self._keep = None, [], []
