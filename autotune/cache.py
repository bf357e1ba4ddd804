"""Per-device tuned-config store: user cache first, then the tables shipped in
autotune/tables/, then the caller's heuristic fallback.

Keys: kernel name ("norm.rmsnorm.triton"), device key ("nvidia-h200" from the device name),
problem key (a short string the kernel derives from its problem, e.g. "N=4096").
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

SHIPPED = Path(__file__).with_name("tables")


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


def _user_dir() -> Path:
    base = os.environ.get("TSKERNELS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tskernels")
    return Path(base) / "autotune"


class Store:
    def __init__(self, user_dir: Path | None = None, shipped_dir: Path = SHIPPED):
        self.user_dir = Path(user_dir) if user_dir else _user_dir()
        self.shipped_dir = Path(shipped_dir)
        self._mem: dict[tuple[str, str], dict] = {}
        self._lock = threading.Lock()

    def _load(self, where: Path, dev: str) -> dict:
        key = (str(where), dev)
        if key not in self._mem:
            path = where / f"{dev}.json"
            try:
                self._mem[key] = json.loads(path.read_text())
            except FileNotFoundError:
                self._mem[key] = {}
            except json.JSONDecodeError as e:
                raise ValueError(f"autotune table {path} is not valid JSON: {e}") from None
        return self._mem[key]

    def get(self, kernel: str, dev: str, problem: str,
            fallback: Callable[[], dict] | None = None) -> dict | None:
        for where in (self.user_dir, self.shipped_dir):
            cfg = self._load(where, dev).get(kernel, {}).get(problem)
            if cfg is not None:
                return dict(cfg)
        return fallback() if fallback else None

    def put(self, kernel: str, dev: str, problem: str, config: dict) -> Path:
        """Persist a tuned config in the user cache (atomic replace)."""
        with self._lock:
            table = self._load(self.user_dir, dev)
            table.setdefault(kernel, {})[problem] = dict(config)
            self.user_dir.mkdir(parents=True, exist_ok=True)
            path = self.user_dir / f"{dev}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(path)
            return path


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
