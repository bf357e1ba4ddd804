"""Where the test tiers find external build tools, and what happens when one is missing.

The CUDA compiler, `cuobjdump` and `nvdisasm` come with the `test` extra as NVIDIA's wheels
(`nvidia-cuda-nvcc` & co., installed under `site-packages/nvidia/cu13/bin`); those pinned copies
are preferred over a system CUDA so that CI compiles with the same release everywhere. cmake /
ctest and the C++ compiler come from the system (or scikit-build-core's build environment).

A missing tool skips its tests with the reason outside CI, and fails them inside CI
(`CI=true`): a CI machine without the compiler must not pass by testing less.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

__all__ = ["IN_CI", "cuda_tool", "require_tool"]

IN_CI = os.environ.get("CI", "").lower() == "true"


def _wheel_bin_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    # cu13 wheels share nvidia/cu13/bin; cu12 wheels have one folder per component
    return [Path(r) / sub for r in roots for sub in ("cu13/bin", "cuda_nvcc/bin",
                                                       "cuda_cuobjdump/bin", "cuda_nvdisasm/bin")]


def cuda_tool(name: str) -> str | None:
    """Path of the CUDA tool `name` ("nvcc", "cuobjdump", "nvdisasm", "ptxas"): the test
    extra's wheel first, then PATH, then /usr/local/cuda/bin; None when none has it."""
    for d in _wheel_bin_dirs():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    p = Path("/usr/local/cuda/bin") / name
    return str(p) if p.is_file() else None


def require_tool(name: str, path: str | None, why: str) -> str:
    """`path` if the tool was found; else skip (outside CI) or fail (CI=true) the calling test
    module with one line saying what is missing, what it is for and how to get it."""
    import pytest

    if path:
        return path
    msg = f"{name} not found ({why})"
    if IN_CI:
        pytest.fail(f"{msg}; CI must have it", pytrace=False)
    pytest.skip(f"{msg}; outside CI these tests are skipped", allow_module_level=True)
    raise AssertionError("unreachable")
