"""The NVRTC cubin disk cache of the hand-written CUDA kernels (ops/cuda_driver.cached_cubin):
hits, keys, damaged entries, an unwritable or disabled cache. NVRTC runs without a GPU."""
from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from tskernels.ops import cuda_driver  # noqa: E402

SRC = 'extern "C" __global__ void bump(float* x) { x[threadIdx.x] += 1.0f; }\n'
OPTS = ("-std=c++17",)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """NVRTC compiles counted; the cache under tmp_path."""
    monkeypatch.setenv("TSKERNELS_CACHE", str(tmp_path))
    monkeypatch.delenv("TSKERNELS_CUBIN_CACHE", raising=False)
    calls = []
    real = cuda_driver.nvrtc_cubin

    def compile_(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(cuda_driver, "nvrtc_cubin", compile_)
    return calls


def test_second_request_is_a_hit_and_keys_differ(counted, tmp_path):
    first = cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a")
    assert first.startswith(b"\x7fELF") and len(counted) == 1
    assert len(list((tmp_path / "cubin").glob("*.cubin"))) == 1
    assert cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a") == first
    assert len(counted) == 1
    # another option, arch or source is another entry
    cuda_driver.cached_cubin(SRC, "bump.cu", (*OPTS, "-DUNUSED=1"), "sm_90a")
    cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_100a")
    cuda_driver.cached_cubin(SRC.replace("1.0f", "2.0f"), "bump.cu", OPTS, "sm_90a")
    assert len(counted) == 4 and len(list((tmp_path / "cubin").glob("*.cubin"))) == 4
    assert not list((tmp_path / "cubin").glob(".*.tmp"))     # no leftovers of the writes


def test_damaged_entry_is_rebuilt(counted, tmp_path):
    cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a")
    (entry,) = (tmp_path / "cubin").glob("*.cubin")
    entry.write_bytes(b"not a cubin")
    again = cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a")
    assert again.startswith(b"\x7fELF") and len(counted) == 2
    assert entry.read_bytes() == again


def test_unwritable_or_disabled_cache_still_compiles(counted, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("TSKERNELS_CACHE", str(blocker))
    assert cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a").startswith(b"\x7fELF")
    monkeypatch.setenv("TSKERNELS_CACHE", str(tmp_path / "off"))
    monkeypatch.setenv("TSKERNELS_CUBIN_CACHE", "0")
    assert cuda_driver.cubin_cache_dir() is None
    assert cuda_driver.cached_cubin(SRC, "bump.cu", OPTS, "sm_90a").startswith(b"\x7fELF")
    assert len(counted) == 2 and not (tmp_path / "off").exists()
