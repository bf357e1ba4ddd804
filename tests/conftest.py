"""Test-tier set-up. Runs before any test module imports a @triton.jit kernel.

CPU machine (CI): TRITON_INTERPRET=1, so every Triton kernel runs in the interpreter on CPU
tensors; hypothesis uses the bounded, derandomized "ci" profile.
CUDA machine: kernels compile for the real device, the `kernel_device` fixture is "cuda",
tests that use it are marked `gpu`, and the larger "gpu" profile applies (`pytest -m gpu`).
HYPOTHESIS_PROFILE overrides the profile.
"""
from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=12, derandomize=True, **_common)
settings.register_profile("dev", max_examples=25, **_common)
settings.register_profile("gpu", max_examples=120, derandomize=True, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpu" if HAS_CUDA else "ci"))

KERNEL_DEVICE = "cuda" if HAS_CUDA else "cpu"

# pytest-xdist workers (the README's test command runs two, one per core of the CI machine)
# share the cores: each gets its share of torch's intra-op threads instead of all of them
# (two workers x two OpenMP threads on two cores spin against each other)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1 and not HAS_CUDA:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def pytest_collection_modifyitems(config, items):
    gpu_only = pytest.mark.skip(reason="needs a CUDA device (GPU tier: run with -m gpu there)")
    for item in items:
        if "kernel_device" in getattr(item, "fixturenames", ()) and HAS_CUDA:
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("gpu") and "kernel_device" not in item.fixturenames \
                and not HAS_CUDA:
            item.add_marker(gpu_only)


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """Where Triton kernels run: the CUDA device, or the CPU through the interpreter."""
    return KERNEL_DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
