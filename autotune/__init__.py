"""Generic autotuning: config spaces, search with a pluggable timer, per-device caches with
shipped tables and a heuristic fallback. Knows nothing about specific kernels.

    space = Space(num_warps=[4, 8, 16], rows=[1, 2, 4], where=lambda c: c["rows"] * 4 <= 16)
    best = search(space, lambda cfg: (lambda: kernel(cfg)), timer=cuda_timer)
    store = Store()                                  # ~/.cache/tskernels/autotune + shipped tables
    store.put("norm.rmsnorm.triton", device_key(), "N=4096", best.config)
    cfg = store.get("norm.rmsnorm.triton", device_key(), "N=4096", fallback=heuristic)
"""
from .cache import Store, default_store, device_key, pow2_bucket
from .search import Result, search
from .space import Space
from .timer import cpu_timer, cuda_timer

__all__ = ["Result", "Space", "Store", "cpu_timer", "cuda_timer", "default_store", "device_key",
           "pow2_bucket", "search"]
