"""Plain-PyTorch reference implementations (ground truth) for every tskernels op.

Runs on CPU, imports neither triton nor tskernels. Each op computes in float32
(float64 when its inputs are float64) and returns the input dtype unless its
docstring says otherwise. Layouts and signatures are listed in docs/OPS.md.

`FAMILIES` is the one list of op families: `tskernels` (its public families, `tskernels.ops`)
and the tests derive theirs from it. A new family adds its name here, its reference module here
and its folder `tskernels/ops/<family>/`. Family modules load on first attribute access.
"""
from __future__ import annotations

import importlib

FAMILIES = ("attention", "mla", "gemm", "moe", "norm", "rope", "activation", "sampling",
            "kvcache", "gdn")

__all__ = ["FAMILIES", *FAMILIES]


def __getattr__(name: str):
    if name in FAMILIES:
        mod = importlib.import_module(f".{name}", __name__)
        globals()[name] = mod
        return mod
    raise AttributeError(f"module 'tskernels_ref' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(FAMILIES))
