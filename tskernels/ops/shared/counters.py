"""Per-device int32 arrival counters for kernels that count programs in and re-arm what they
used (split-style combines, the decode MoE's slot and part counters, the router's token
tickets): allocated zeroed on first use (before any graph capture that uses them, as the
serving warm-up does), one buffer per (owner, device), so two kernels never share one."""
from __future__ import annotations

import torch

_buffers: dict[tuple[str, torch.device], torch.Tensor] = {}


def zeroed(owner: str, device: torch.device, n: int) -> torch.Tensor:
    """`owner`'s n int32 counters on `device` (zeros until a kernel leaves them otherwise;
    every user returns them to zero before its launch ends)."""
    c = _buffers.get((owner, device))
    if c is None or c.numel() < n:
        c = _buffers[(owner, device)] = torch.zeros(n, dtype=torch.int32, device=device)
    return c
