"""tskernels: Triton-first kernels for LLM inference.

    import tskernels
    y = tskernels.norm.rmsnorm(x, weight)                 # selected backend for x's device
    tskernels.explain("attention", "decode", device="cuda", formats={"q": "bf16", "kv": "bf16"})
    with tskernels.use_backend("reference"): ...
    with tskernels.use_backend(tskernels.KernelPolicy({"gemm.mm": "torch_native"})): ...
    g = tskernels.CPUGraph(); with g.capture(): step()   # then g.replay() (tskernels.cpu_graph)
    tskernels.available("norm", "rmsnorm", "cpu_native", device="cpu")

Importing this package touches no GPU driver and imports no kernels: op families load on first
attribute access (`tskernels.attention`), the registry on first selection.
"""
from __future__ import annotations

import importlib

# the one list of op families lives with the references (the bottom layer); the rest derives
from tskernels_ref import FAMILIES

from .cache_spec import GQACacheSpec, KVCacheSpec, MLACacheSpec
from .config import active_policy, use_backend
from .platform import Platform, platform_of
from .policy import KernelPolicy, available
from .registry import (KernelSpec, SelectionError, clear_cache, explain, fmt, kernels, register,
                       select)

__version__ = "0.1.0"

__all__ = ["FAMILIES", "GQACacheSpec", "KVCacheSpec", "KernelPolicy", "KernelSpec",
           "MLACacheSpec", "Platform", "SelectionError", "active_policy", "available",
           "clear_cache", "explain", "fmt", "kernels", "platform_of", "register", "select",
           "use_backend", "CPUGraph", *FAMILIES]


def __getattr__(name: str):
    if name in FAMILIES:
        mod = importlib.import_module(f".ops.{name}", __name__)
        globals()[name] = mod
        return mod
    if name == "CPUGraph":
        from .cpu_graph import CPUGraph
        return CPUGraph
    raise AttributeError(f"module 'tskernels' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(FAMILIES))
