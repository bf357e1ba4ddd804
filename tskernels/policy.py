"""Kernel policies: an engine's standing backend preferences, and `available(...)`.

An engine that wants, say, native-dtype 16-bit GEMMs and the C++ CPU kernels wherever they
apply describes that once as a `KernelPolicy` and activates it for its forward passes:

    policy = tskernels.KernelPolicy({"gemm.mm": ("cpu_stream", "torch_native"),
                                     "norm": "cpu_native", "attention": "torch_cpu"})
    with tskernels.use_backend(policy):
        logits = model(input_ids, batch)

A preference is soft: for each call the first listed backend that is registered and can run
that problem (device, formats, traits) is used, otherwise the registry's own choice. An explicit
override (the per-call `backend=` argument, a `use_backend("name")` block inside the policy's)
still wins; the policy is one layer of `tskernels.config`'s override stack, so it is local to
the thread / task that entered it. Keys are "family.op", "family" or "*" as in
`use_backend`; the most specific key that names the op wins.

`available(family, op, backend, device=...)` asks whether a backend is registered and can run on
a device (an engine that wants to log or branch on it never needs to import a backend module).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, eq=False)
class KernelPolicy:
    """Ordered soft backend preferences per "family.op" / "family" / "*" key.

    prefer: {key: backend name or tuple of names, first preferred}. Compared and hashed by
    identity (selection caches per policy object, so build one per engine, not per call).
    """

    prefer: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    name: str = "policy"

    def __post_init__(self):
        norm = {}
        for key, val in dict(self.prefer).items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"prefer: keys must be 'family.op', 'family' or '*', got {key!r}")
            names = (val,) if isinstance(val, str) else tuple(val)
            if not names or not all(isinstance(n, str) and n for n in names):
                raise TypeError(f"prefer[{key!r}]: expected a backend name or a tuple of "
                                f"names, got {val!r}")
            norm[key] = names
        object.__setattr__(self, "prefer", norm)

    def lookup(self, family: str, op: str) -> tuple[str, ...]:
        """The preferred backends for `family.op` (most specific key wins), or ()."""
        p = self.prefer
        return p.get(f"{family}.{op}") or p.get(family) or p.get("*") or ()

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={'>'.join(v)}" for k, v in self.prefer.items())
        return f"KernelPolicy({self.name}: {items})"


def available(family: str, op: str, backend: str, *, device: torch.device | str | None = None,
              formats: Mapping[str, str] | None = None,
              traits: Mapping[str, object] | None = None) -> bool:
    """Whether `backend` is registered for `family.op` and can run on `device` (default: the
    current default device), optionally for a problem's formats / traits. Verification is
    not required (this answers "could I name it", as `backend=` would)."""
    from . import registry
    from .platform import platform_of

    p = platform_of(device)
    for k in registry.kernels(family, op):
        if k.backend == backend:
            return registry._filter_reason(k, p, formats or {}, traits or {}, "default",
                                           named=True) is None
    return False
