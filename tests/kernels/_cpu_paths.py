"""The C++ CPU kernels' SIMD paths, and a loop that runs a check under each of them."""
from __future__ import annotations

import os
from collections.abc import Callable

import torch

from tskernels import platform as plat
from tskernels.ops.gemm import cpu_stream


def simd_paths() -> list[str]:
    """The SIMD paths this CPU can run (TSKERNELS_CPU_ISA only narrows), the portable loop
    last; none without the extension."""
    if not cpu_stream.available():
        return []
    best = cpu_stream._cpu.detected_isa()
    return {"avx512": ["avx512", "avx2"], "avx2": ["avx2"], "neon": ["neon"]}.get(best, []) \
        + ["scalar"]


def each_path(fn: Callable[[str], None], threads: int | None = None) -> None:
    """fn(path) under TSKERNELS_CPU_ISA=path for every path (and `threads` torch threads);
    the caller's settings are restored."""
    prev, old = torch.get_num_threads(), os.environ.get(plat.ISA_ENV)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for path in simd_paths():
            os.environ[plat.ISA_ENV] = path
            assert cpu_stream._cpu.isa() == path
            fn(path)
    finally:
        torch.set_num_threads(prev)
        if old is None:
            os.environ.pop(plat.ISA_ENV, None)
        else:
            os.environ[plat.ISA_ENV] = old
