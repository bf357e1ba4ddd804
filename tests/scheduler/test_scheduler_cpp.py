"""Builds the scheduler's C++ unit tests with cmake and runs them with ctest: once plainly and
once under AddressSanitizer + UndefinedBehaviorSanitizer (-O1). CI runs only `pytest`, so
this is where the C++ tests and the sanitizer build run."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent / "cpp"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"`{name}` not found on PATH: the scheduler's C++ tests cannot run"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("variant", ["plain", "asan_ubsan"])
def test_cpp_unit_tests(variant: str, tmp_path: Path) -> None:
    cmake, ctest = _tool("cmake"), _tool("ctest")
    build = tmp_path / variant
    configure = [cmake, "-S", str(SOURCE), "-B", str(build), "-DCMAKE_UNITY_BUILD=ON"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    if variant == "plain":
        configure += ["-DCMAKE_BUILD_TYPE=Release"]
    else:  # no build type: the sanitizer flags (-O1, frame pointers) apply alone, plus line info
        configure += ["-DSCHEDULER_SANITIZE=ON", "-DCMAKE_CXX_FLAGS=-g1"]
    env = dict(os.environ, CCACHE_DISABLE="1")
    for cmd in (configure, [cmake, "--build", str(build), "--parallel", str(os.cpu_count() or 2)]):
        result = _run(cmd, env=env)
        assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    env.update(ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    result = _run([ctest, "--output-on-failure"], env=env, cwd=build)
    assert result.returncode == 0, f"ctest ({variant}) failed:\n{result.stdout}\n{result.stderr}"
    assert "100% tests passed" in result.stdout, result.stdout
