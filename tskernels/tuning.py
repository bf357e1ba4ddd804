"""How kernels take their launch configs from `autotune`: one lookup per (kernel, bucket),
memoised, through the documented fallback chain (exact -> nearest bucket -> device family ->
the kernel's heuristic); and a runner that lets `python -m autotune tune` time a kernel.

A backend declares its space beside the kernel (see `autotune.declare`) and asks

    cfg = tuning.config(SPACE, problem, x.device)

at launch (or plan) time. Lookups never search: tuning is `python -m autotune tune ...`
(or `tskernels-bench --tune`). `explain(SPACE, problem, device)` says which link supplied it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from autotune import Choice, KernelSpace, Runner, Target, backend_options, choose, device_key

__all__ = ["ROTATE_BYTES", "TensorRunner", "backend_options", "choice", "config", "dtype_name",
           "explain", "parse_shape", "rows_bucket"]

# Bytes of input copies a memory-bound runner rotates through (H200 L2: 50 MB), so a timing
# reads DRAM, not L2.
ROTATE_BYTES = 256 << 20


def parse_shape(text: str) -> dict:
    """'N=4096,rows=8,dtype=bfloat16' -> {'N': 4096, 'rows': 8, 'dtype': 'bfloat16'}."""
    out = {}
    for part in filter(None, text.split(",")):
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"shape {text!r}: expected name=value pairs, got {part!r}")
        out[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rows_bucket(n_rows: int) -> int:
    """Coarse row-count buckets: decode batches, prefill chunks, long prefills."""
    return 1 if n_rows < 64 else 64 if n_rows < 1024 else 1024 if n_rows < 16384 else 16384


def _device_name(device) -> str:
    dev = torch.device(device)
    return "cpu" if dev.type == "cpu" else device_key(dev)


_TARGETS: dict[str, Target | None] = {}


def _target(device) -> Target | None:
    """The budgets tuned configs must fit on `device` (None on the CPU)."""
    dev = torch.device(device)
    key = str(dev)
    if key not in _TARGETS:
        from .platform import platform_of
        p = platform_of(dev)
        _TARGETS[key] = Target.for_arch(p.target) if p.is_gpu else None
    return _TARGETS[key]


def choice(ks: KernelSpace, problem: Mapping, device) -> Choice:
    return choose(ks, problem, _device_name(device), _target(device))


def config(ks: KernelSpace, problem: Mapping, device) -> dict:
    """The launch config for `problem` on `device` (do not mutate: it is memoised)."""
    return choice(ks, problem, device).config


def explain(ks: KernelSpace, problem: Mapping, device) -> str:
    return choice(ks, problem, device).explain()


class TensorRunner(Runner):
    """Runner over `copies` of one problem's inputs.

    make(device) -> inputs (a tuple of tensors); launch(cfg, inputs) -> output; reference(inputs)
    -> the expected output (any torch reference of the op). Copies are made until they hold
    ROTATE_BYTES (at least one), and each timed call uses the next copy.
    """

    def __init__(self, make: Callable[[str], tuple], launch: Callable[[dict, tuple], torch.Tensor],
                 reference: Callable[[tuple], torch.Tensor], device: str, *,
                 rotate: bool = True):
        first = make(device)
        size = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
        # rotation defeats the GPU's L2; on the CPU (the interpreter) one copy is enough
        n = 1 if not rotate or size == 0 or torch.device(device).type != "cuda" \
            else max(1, min(64, ROTATE_BYTES // max(size, 1)))
        self.inputs = [first] + [make(device) for _ in range(n - 1)]
        self.launch, self.reference, self._i = launch, reference, 0
        self.expected = reference(first)

    def build(self, cfg: dict):
        def call():
            self._i = (self._i + 1) % len(self.inputs)
            return self.launch(cfg, self.inputs[self._i])
        return call

    def check(self, cfg: dict) -> bool:
        from .numerics import tolerance
        out = self.launch(cfg, self.inputs[0])
        outs = out if isinstance(out, (tuple, list)) else (out,)
        refs = self.expected if isinstance(self.expected, (tuple, list)) else (self.expected,)
        for o, r in zip(outs, refs):
            tol = tolerance(o.dtype)
            rel_rms, rel_max = _rel_errors(o, r)
            if not (rel_rms <= tol.rel_rms and rel_max <= tol.rel_max):
                return False
        return True


def _rel_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(rel_rms, rel_max) as `numerics.error_stats` computes them, on the output's device (a
    tuner checks every candidate: copying a 8192 x 8192 product to the host each time would
    cost more than timing it). NaN where the reference is finite counts as infinite error."""
    if out.shape != ref.shape:
        return float("inf"), float("inf")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    finite = torch.isfinite(r)
    d = torch.where(finite, (o - r).abs(), torch.zeros_like(r))
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    rf = torch.where(finite, r, torch.zeros_like(r))
    if d.numel() == 0:
        return 0.0, 0.0
    tiny = 1e-30
    return (d.norm().item() / max(rf.norm().item(), tiny),
            d.max().item() / max(rf.abs().max().item(), tiny))


def engine_start(capture_path: str | None, window_s: float, device, *,
                 timer: Callable | None = None, tables=None, clock=None):
    """What an engine does for autotuning at start, before it captures CUDA graphs:
    record the shape histogram of its traffic into `capture_path` (when given), and with
    `window_s` > 0 on a GPU tune the captured buckets of this device that have no table entry
    (`autotune.window.tune_missing`), persisting them to the user cache; the lookups then see
    the new entries. Returns the window's report (None when no window ran). The capture file
    is the one given, else $TSKERNELS_CAPTURE_SHAPES."""
    import os
    from pathlib import Path

    from autotune import capture, default_lookup
    from autotune.window import tune_missing
    if capture_path:
        capture.enable(capture_path)
    if not window_s or window_s <= 0:
        return None
    dev = torch.device(device)
    path = capture_path or os.environ.get("TSKERNELS_CAPTURE_SHAPES")
    if (dev.type != "cuda" and timer is None) or not path or not Path(path).exists():
        return None
    from autotune import cuda_graph_timer
    tgt = _target(dev) or Target("cpu", "cpu", 1 << 30, 1)
    kw = {"clock": clock} if clock is not None else {}
    import logging
    log = logging.getLogger("tskernels.tuning")
    try:
        rep = tune_missing(capture.load(path), budget_s=float(window_s), device=str(dev),
                           device_name=_device_name(dev), target=tgt,
                           timer=timer or cuda_graph_timer, tables=tables, **kw)
    except Exception as e:  # noqa: BLE001 - the engine starts without the window's results
        log.warning("autotune start-up window failed (%s: %s); serving with the tables as "
                    "they are", type(e).__name__, e)
        return None
    finally:
        default_lookup().invalidate()
    log.info("%s", rep.summary())
    return rep
