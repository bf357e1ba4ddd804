"""Shape capture: the (kernel, bucket) histogram of real traffic, for tuning what is served.

Enabled by `TSKERNELS_CAPTURE_SHAPES=path` (or `enable(path)`, which the engine's
`--capture-shapes` flag calls): every config lookup counts its kernel and bucket; the file is
rewritten atomically every `FLUSH_EVERY` new records and at exit:

    {"format": 1, "shapes": [{"kernel": "attention.decode.triton", "device": "nvidia-h200",
                              "bucket": "L=4096,bh=512,d=128,g=4,kv=bf16", "count": 1234}]}

`python -m autotune tune --from-capture path` tunes exactly those buckets, most frequent first.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
from collections import Counter
from pathlib import Path

FLUSH_EVERY = 256

_lock = threading.Lock()
_counts: Counter = Counter()
_path: Path | None = None
_since_flush = 0
_registered = False


def enable(path: str | os.PathLike) -> None:
    """Start counting lookups into `path` (merging with what the file already holds)."""
    global _path, _registered
    with _lock:
        _path = Path(path)
        try:
            rows = load(_path) if _path.exists() else []
            for s in rows:
                _counts[(s["kernel"], s["device"], s["bucket"])] += s["count"]
        except (ValueError, KeyError, TypeError) as e:   # JSONDecodeError is a ValueError
            import warnings
            warnings.warn(f"autotune capture: {_path} is not a readable capture file ({e}); "
                          "counting starts afresh and overwrites it", UserWarning, stacklevel=2)
            _counts.clear()
        if not _registered:
            atexit.register(flush)
            _registered = True


def disable() -> None:
    global _path
    flush()
    with _lock:
        _path = None
        _counts.clear()


def enabled() -> bool:
    return _path is not None


def record(kernel: str, bucket: str, device: str) -> None:
    global _since_flush
    if _path is None:
        return
    with _lock:
        _counts[(kernel, device, bucket)] += 1
        _since_flush += 1
        due = _since_flush >= FLUSH_EVERY
    if due:
        flush()


def flush() -> Path | None:
    global _since_flush
    with _lock:
        if _path is None:
            return None
        rows = [{"kernel": k, "device": d, "bucket": b, "count": n}
                for (k, d, b), n in sorted(_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        _since_flush = 0
        path = _path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": 1, "shapes": rows}, indent=1) + "\n")
    tmp.replace(path)
    return path


def load(path: str | os.PathLike) -> list[dict]:
    """The captured rows of a file, most frequent first."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict) or raw.get("format") != 1 or not isinstance(raw.get("shapes"), list):
        raise ValueError(f"{path}: not a shape-capture file (expected format 1 with 'shapes')")
    return sorted(raw["shapes"], key=lambda s: (-s["count"], s["kernel"], s["bucket"]))


if os.environ.get("TSKERNELS_CAPTURE_SHAPES"):
    enable(os.environ["TSKERNELS_CAPTURE_SHAPES"])
