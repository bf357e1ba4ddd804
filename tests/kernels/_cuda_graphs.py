"""CUDA-graph replay checks shared by the GPU-tier kernel tests."""
from __future__ import annotations

import torch


def assert_replays_equal(graph: torch.cuda.CUDAGraph, out: torch.Tensor, want: torch.Tensor,
                         times: int = 3) -> None:
    """Replay `graph` `times` times, its output `out` poisoned with NaN before each: every
    replay must write `out` equal to `want` bit for bit (an element it leaves unwritten stays
    NaN and fails)."""
    for i in range(times):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {i} differs"
