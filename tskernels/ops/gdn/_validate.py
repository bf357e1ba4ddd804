"""What the gdn Triton backends share (formats, head dims, chunk length), kept here so that no
backend imports another (the import-linter contract)."""
from __future__ import annotations

CHUNK = 64  # tokens per chunk of the chunked prefill
HEAD_DIMS = frozenset((16, 32, 64, 128))  # K and V the Triton kernels take (power-of-two tiles)
FORMATS = {"q": ("fp32", "fp16", "bf16"), "state": ("fp32",)}


def head_dim_ok(d: int) -> bool:
    """A head dim the Triton kernels take (K or V)."""
    return d in HEAD_DIMS
