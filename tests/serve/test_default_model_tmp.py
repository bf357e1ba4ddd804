"""An interrupted GGUF -> safetensors conversion leaves nothing behind for long: the next
conversion removes temp dirs whose converting process is gone (SIGTERM / SIGKILL skip the
cleanup in `finally`), and keeps those of a conversion still running."""
from __future__ import annotations

import os
import subprocess
import sys

from serve.default_model import MODEL_NAME, _remove_stale_temp_dirs


def test_stale_conversion_dirs_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".{MODEL_NAME}-{dead}-x1"
    live = tmp_path / f".{MODEL_NAME}-{os.getpid()}-x2"
    other = tmp_path / f"{MODEL_NAME}-v1"          # a finished conversion: never touched
    for d in (stale, live, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    _remove_stale_temp_dirs(tmp_path)
    assert not stale.exists() and live.exists() and other.exists()
