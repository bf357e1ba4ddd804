"""Per-device tuned-config store: user cache first, then the tables shipped in
autotune/tables/ (see `autotune.table` for the file format), then the caller's fallback.

Keys: kernel name ("norm.rmsnorm.triton"), device key ("nvidia-h200" from the device name),
problem key (a short string the kernel derives from its problem, e.g. "N=4096").
"""
from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from pathlib import Path

from .table import SHIPPED, Entry, Tables, current_versions


@functools.lru_cache(maxsize=None)
def _device_key(index: int | None) -> str:
    return _compute_device_key(index)


def device_key(device=None) -> str:
    """'nvidia-h200', 'amd-mi300x', 'cpu': lower-case vendor + model, stable across machines
    (cached per device)."""
    try:
        import torch

        if device is not None:
            d = torch.device(device)
            if d.type == "cpu":
                return "cpu"
            return _device_key(d.index)
    except Exception:
        return "cpu"
    return _device_key(None)


def _compute_device_key(device=None) -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
        name = torch.cuda.get_device_name(device)
    except Exception:
        return "cpu"
    name = name.lower().replace("nvidia", "").replace("amd", "").replace("instinct", "")
    vendor = "amd" if "mi" in name.split() or name.strip().startswith("mi") else "nvidia"
    return f"{vendor}-" + re.sub(r"[^a-z0-9]+", "-", name).strip("-")


class Store:
    """Plain (kernel, device, bucket) -> config access over the versioned tables, for callers
    that key their problems themselves; `autotune.lookup` adds the fallback chain and the
    staleness checks on top of the same files."""

    def __init__(self, user_dir: Path | None = None, shipped_dir: Path = SHIPPED):
        self.tables = Tables(user_dir, shipped_dir)
        self.user_dir, self.shipped_dir = self.tables.user, self.tables.shipped
        self._lock = threading.Lock()

    def get(self, kernel: str, dev: str, problem: str,
            fallback: Callable[[], dict] | None = None) -> dict | None:
        for table in self.tables.layers(dev):
            e = table.entries.get((kernel, problem))
            if e is not None:
                return dict(e.config)
        return fallback() if fallback else None

    def put(self, kernel: str, dev: str, problem: str, config: dict) -> Path:
        """Persist a tuned config in the user cache (atomic replace)."""
        with self._lock:
            table = self.tables.table(self.user_dir, dev)
            table.put(Entry(kernel, problem, dict(config), versions=dict(current_versions())))
            return table.save()


_default: Store | None = None


def default_store() -> Store:
    """The process-wide store (user cache + shipped tables) kernels consult at plan time."""
    global _default
    if _default is None:
        _default = Store()
    return _default


def pow2_bucket(n: int) -> int:
    """Smallest power of two >= n (>= 1): the bucket a problem size is tuned under."""
    return 1 << max(0, int(n) - 1).bit_length()
