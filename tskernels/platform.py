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


# CPU features a CPU kernel may require, by the name /proc/cpuinfo gives them (x86 "flags",
# AArch64 "Features": asimd is NEON). TSKERNELS_CPU_ISA caps them (and the C++ kernels' SIMD
# level, tskernels/csrc/cpu_common.h) so that a narrower CPU's path can be measured on a wider one.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_tile",
                "amx_bf16", "amx_int8", "neon", "sve", "sve2", "asimddp", "bf16", "i8mm")
_ISA_CAPS = {  # cap -> features it removes
    "avx512": ("amx_tile", "amx_bf16", "amx_int8"),
    "avx2": ("avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
             "amx_int8"),
    "neon": ("sve", "sve2"),
    "scalar": CPU_FEATURES,
}
ISA_ENV = "TSKERNELS_CPU_ISA"


@functools.lru_cache(maxsize=1)
def detected_cpu_features() -> frozenset[str]:
    """The CPU's SIMD features (names as in CPU_FEATURES) from /proc/cpuinfo, else from torch's
    own detection (torch.backends.cpu.get_cpu_capability()); empty when neither answers."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(val.split())
                    break
    except OSError:
        pass
    if "asimd" in flags:
        flags.add("neon")
    if not flags:  # no /proc (macOS, Windows): torch knows the vector ISA it dispatches to
        try:
            cap = torch.backends.cpu.get_cpu_capability().upper()
        except Exception:
            cap = ""
        if cap.startswith("AVX512"):
            flags |= {"avx512f", "avx512bw", "avx2", "fma"}
        elif cap.startswith("AVX2"):
            flags |= {"avx2", "fma"}
        elif cap in ("NEON", "SVE", "SVE256") or platform_machine() in ("arm64", "aarch64"):
            flags.add("neon")
            if cap.startswith("SVE"):
                flags.add("sve")
    return frozenset(f for f in CPU_FEATURES if f in flags)


def platform_machine() -> str:
    import platform as _pl

    try:
        return _pl.machine().lower()
    except Exception:
        return ""


def isa_cap() -> str | None:
    """The TSKERNELS_CPU_ISA cap ("avx512", "avx2", "neon", "scalar"), or None (unset or not
    one of those: ignored, since describing the platform never raises)."""
    v = os.environ.get(ISA_ENV, "").strip().lower()
    return v if v in _ISA_CAPS else None


def cpu_features() -> frozenset[str]:
    """detected_cpu_features() minus what the TSKERNELS_CPU_ISA cap removes."""
    feats = detected_cpu_features()
    cap = isa_cap()
    return feats - frozenset(_ISA_CAPS[cap]) if cap else feats


def _cpu() -> Platform:
    return _cpu_platform(isa_cap(), interpreter_enabled())


@functools.lru_cache(maxsize=None)
def _cpu_platform(cap: str | None, interpreter: bool) -> Platform:
    name = "cpu" if cap is None else f"cpu ({ISA_ENV}={cap})"
    return Platform(vendor="cpu", name=name, features=cpu_features(), interpreter=interpreter)


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
