"""Plain-PyTorch reference implementations (ground truth) for every tskernels op.

Runs on CPU, imports neither triton nor tskernels. Each op computes in float32
(float64 when its inputs are float64) and returns the input dtype unless its
docstring says otherwise. Layouts and signatures are listed in docs/OPS.md.
"""
from __future__ import annotations

from . import activation, attention, gdn, gemm, kvcache, mla, moe, norm, rope, sampling

__all__ = ["activation", "attention", "gdn", "gemm", "kvcache", "mla", "moe", "norm", "rope",
           "sampling"]
