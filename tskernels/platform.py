"""What hardware a tensor lives on, detected lazily and never raising.

`import tskernels` must not touch a GPU driver, so nothing here runs at import time: the first
`platform_of(device)` call asks torch, caches the answer per device, and falls back to the CPU
description when anything goes wrong (no driver, no device, a broken install).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

# Hardware features a kernel may require (KernelSpec.capability.features).
_NVIDIA_FEATURES = {
    # (min sm, max sm exclusive): features
    (80, 10_000): {"cp_async", "bf16"},
    (89, 10_000): {"fp8"},
    (90, 91): {"tma", "wgmma", "fp8"},
    (100, 104): {"tma", "tcgen05", "fp8"},
    (120, 122): {"tma", "fp8"},
}
_AMD_FEATURES = {
    "gfx942": {"mfma", "fp8", "bf16"},
    "gfx950": {"mfma", "fp8", "bf16"},
    "gfx90a": {"mfma", "bf16"},
}


@dataclass(frozen=True)
class Platform:
    """One device as the registry sees it.

    vendor: "nvidia", "amd" or "cpu". arch: the SM number (90 for sm_90) on NVIDIA, the gfx
    name on AMD, None on CPU. target: the string verification records use ("sm_90",
    "gfx942", "cpu"). interpreter: True when Triton kernels run on the CPU through
    TRITON_INTERPRET=1 (testing only: never auto-selected).
    """

    vendor: str
    arch: int | str | None = None
    name: str = "cpu"
    features: frozenset[str] = field(default_factory=frozenset)
    num_sms: int = 0
    interpreter: bool = False

    @property
    def target(self) -> str:
        if self.vendor == "nvidia":
            return f"sm_{self.arch}"
        if self.vendor == "amd":
            return str(self.arch)
        return "cpu"

    @property
    def is_gpu(self) -> bool:
        return self.vendor in ("nvidia", "amd")


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_CPU = Platform(vendor="cpu", name="cpu")
_CPU_INTERP = Platform(vendor="cpu", name="cpu", interpreter=True)


def _cpu() -> Platform:
    return _CPU_INTERP if interpreter_enabled() else _CPU


def nvidia_features(sm: int) -> frozenset[str]:
    feats: set[str] = set()
    for (lo, hi), f in _NVIDIA_FEATURES.items():
        if lo <= sm < hi:
            feats |= f
    return frozenset(feats)


def amd_features(gfx: str) -> frozenset[str]:
    return frozenset(_AMD_FEATURES.get(gfx, set()))


@functools.lru_cache(maxsize=None)
def _gpu_platform(index: int) -> Platform:
    try:
        props = torch.cuda.get_device_properties(index)
    except Exception:  # no driver, bad index, broken install: describe as CPU
        return _cpu()
    if getattr(torch.version, "hip", None):
        gfx = getattr(props, "gcnArchName", "").split(":")[0] or "gfx"
        return Platform("amd", gfx, props.name, amd_features(gfx), props.multi_processor_count)
    sm = props.major * 10 + props.minor
    return Platform("nvidia", sm, props.name, nvidia_features(sm), props.multi_processor_count)


def platform_of(device: torch.device | str | None = None) -> Platform:
    """The platform for `device` (a torch device; None means the current default CUDA device
    when one exists, else the CPU). Never raises."""
    if device is None:
        try:
            if torch.cuda.is_available():
                return _gpu_platform(torch.cuda.current_device())
        except Exception:
            pass
        return _cpu()
    device = torch.device(device)
    if device.type == "cuda":
        return _gpu_platform(device.index if device.index is not None else _current_index())
    return _cpu()


def _current_index() -> int:
    try:
        return torch.cuda.current_device()
    except Exception:
        return 0
