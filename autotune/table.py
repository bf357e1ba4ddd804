"""Versioned tuning tables: one JSON file per device, entries stamped with what they were tuned on.

    {"format": 2, "device": "nvidia-h200",
     "entries": [{"kernel": "attention.decode.triton", "bucket": "L=4096,bh=512,d=128,g=4,kv=bf16",
                  "config": {...}, "us": 250.2, "source_hash": "3f0c...", "ties": [...],
                  "versions": {"triton": "3.6.0", "cuda": "13.0", "torch": "2.11.0"},
                  "date": "2026-12-01", "evidence": "benchmarks/results/h200/..."}]}

An entry is *stale* when the kernel's source hash or the Triton / CUDA / ROCm version differs
from what it was tuned with; stale entries are never used (the lookup warns once per table).
Format-1 files (`{kernel: {bucket: config}}`, no stamps) still load; their entries count as
unversioned, hence stale, once a kernel declares a source hash.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

SHIPPED = Path(__file__).with_name("tables")
FORMAT = 2

# Devices whose tuned configs transfer: same SM / CU architecture, similar memory system.
_FAMILIES = (
    ("hopper", r"h100|h200|h800|h20\b|gh200"),
    ("ampere", r"a100|a800|a30\b"),
    ("ada", r"l40|l4\b|rtx-40|rtx-6000-ada"),
    ("blackwell", r"b200|gb200|b300|gb300"),
    ("blackwell-consumer", r"rtx-50|rtx-pro-6000"),
    ("cdna3", r"mi300|mi325"),
    ("cdna4", r"mi350|mi355"),
)


def device_family(device: str) -> str | None:
    """'hopper' for 'nvidia-h100-80gb-hbm3' and 'nvidia-h200', 'cdna3' for MI300X / MI325X..."""
    for family, pattern in _FAMILIES:
        if re.search(pattern, device):
            return family
    return None


@functools.lru_cache(maxsize=1)
def current_versions() -> dict[str, str]:
    """The library versions an entry is stamped with and compared against."""
    out: dict[str, str] = {}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional on some platforms
        pass
    try:
        import torch
        out["torch"] = torch.__version__.split("+")[0]
        if torch.version.cuda:
            out["cuda"] = torch.version.cuda
        if getattr(torch.version, "hip", None):
            out["rocm"] = torch.version.hip
    except Exception:  # noqa: BLE001
        pass
    return out


# Versions whose change can change a kernel's speed (torch's does not: it only launches).
VERSIONED = ("triton", "cuda", "rocm")


@dataclass
class Entry:
    kernel: str
    bucket: str
    config: dict
    us: float | None = None
    source_hash: str | None = None
    versions: dict = field(default_factory=dict)
    ties: list = field(default_factory=list)
    date: str | None = None
    evidence: str | None = None

    def stale_reason(self, source_hash: str | None, versions: dict | None = None) -> str | None:
        """Why this entry must not be used now, or None when it is current."""
        versions = current_versions() if versions is None else versions
        if source_hash is not None and self.source_hash != source_hash:
            return ("unversioned entry (no source hash)" if self.source_hash is None else
                    f"kernel source changed ({self.source_hash} -> {source_hash})")
        for lib in VERSIONED:
            was, now = self.versions.get(lib), versions.get(lib)
            if was is not None and now is not None and was != now:
                return f"{lib} {was} -> {now}"
        return None

    def to_json(self) -> dict:
        d = {"kernel": self.kernel, "bucket": self.bucket, "config": self.config}
        for k in ("us", "source_hash", "date", "evidence"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.versions:
            d["versions"] = self.versions
        if self.ties:
            d["ties"] = self.ties
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        return cls(kernel=d["kernel"], bucket=d["bucket"], config=dict(d["config"]),
                   us=d.get("us"), source_hash=d.get("source_hash"),
                   versions=dict(d.get("versions") or {}), ties=list(d.get("ties") or []),
                   date=d.get("date"), evidence=d.get("evidence"))


class Table:
    """The entries of one device's file; `(kernel, bucket)` is unique."""

    def __init__(self, path: Path, device: str, entries: dict | None = None):
        self.path, self.device = Path(path), device
        self.entries: dict[tuple[str, str], Entry] = entries or {}

    @classmethod
    def load(cls, path: Path, device: str | None = None) -> "Table":
        path = Path(path)
        device = device or path.stem
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, device)
        except json.JSONDecodeError as e:
            raise ValueError(f"autotune table {path} is not valid JSON: {e}") from None
        entries = {}
        if isinstance(raw, dict) and raw.get("format") == FORMAT:
            for d in raw.get("entries", []):
                e = Entry.from_json(d)
                entries[(e.kernel, e.bucket)] = e
        elif isinstance(raw, dict) and "format" not in raw:      # format 1: kernel -> bucket -> cfg
            for kernel, rows in raw.items():
                for bucket, cfg in rows.items():
                    cfg = dict(cfg)
                    us = cfg.pop("measured_us", None)
                    evidence = cfg.pop("source", None)
                    entries[(kernel, bucket)] = Entry(kernel, bucket, cfg, us=us, evidence=evidence)
        else:
            raise ValueError(f"autotune table {path}: unknown format {raw.get('format')!r}")
        return cls(path, raw.get("device", device) if isinstance(raw, dict) else device, entries)

    def for_kernel(self, kernel: str) -> list[Entry]:
        return [e for (k, _), e in sorted(self.entries.items()) if k == kernel]

    def put(self, entry: Entry) -> None:
        self.entries[(entry.kernel, entry.bucket)] = entry

    def remove(self, kernel: str, bucket: str) -> bool:
        return self.entries.pop((kernel, bucket), None) is not None

    def to_json(self) -> dict:
        return {"format": FORMAT, "device": self.device,
                "entries": [e.to_json() for _, e in sorted(self.entries.items())]}

    def save(self, path: Path | None = None) -> Path:
        """Atomic replace (a crash mid-write never leaves half a table)."""
        path = Path(path or self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
        return path


def user_dir() -> Path:
    """Where local tuning results go: $TSKERNELS_CACHE/autotune (default ~/.cache/tskernels)."""
    base = os.environ.get("TSKERNELS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tskernels")
    return Path(base) / "autotune"


class Tables:
    """The user directory over the shipped one: every device's table, loaded once."""

    def __init__(self, user: Path | None = None, shipped: Path = SHIPPED):
        self.user = Path(user) if user else user_dir()
        self.shipped = Path(shipped)
        self._cache: dict[Path, Table] = {}
        self._lock = threading.Lock()

    def table(self, where: Path, device: str) -> Table:
        path = Path(where) / f"{device}.json"
        with self._lock:
            if path not in self._cache:
                self._cache[path] = Table.load(path, device)
            return self._cache[path]

    def devices(self) -> list[str]:
        names = set()
        for where in (self.user, self.shipped):
            if where.is_dir():
                names |= {p.stem for p in where.glob("*.json")}
        return sorted(names)

    def layers(self, device: str) -> list[Table]:
        """User table first (local results win), then the shipped one."""
        return [self.table(self.user, device), self.table(self.shipped, device)]

    def invalidate(self) -> None:
        with self._lock:
            self._cache.clear()
