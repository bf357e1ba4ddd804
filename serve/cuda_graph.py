"""CUDA graphs for decode steps: one graph per padded batch size, captured over static input
buffers (token ids, positions, slots, page table, sequence lengths) whose decode plans were built
once on those same buffers, so a replay only needs the buffers refreshed in place.

Padding rows get slot -1 (store skipped) and sequence length 0 (attention returns zeros).
Capture fails loudly if any op synchronises with the host; the runner then decodes eagerly.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .forward_batch import ForwardBatch, StepMeta


def _capture(step, pool):
    """Record `step()` into a CUDA graph; returns (graph, the output tensor it writes)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()
    return graph, out


def _pool():
    return torch.cuda.graph_pool_handle()


def _sync(dev):
    torch.cuda.synchronize(dev)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_bs]
    sizes += list(range(16, max_bs, 16))
    return sorted(set(sizes + [max_bs]))


class CudaGraphs:
    def __init__(self, runner, max_num_seqs: int, max_bs: int = 256):
        self.runner = runner
        dev = runner.device
        max_bs = min(max_num_seqs, max_bs)
        self.sizes = graph_batch_sizes(max_bs)
        width = math.ceil(runner.max_model_len / runner.page_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
        self.page_table = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        # per size: the graph, its output, and the attention state whose plans (and their
        # split-KV workspaces) the captured kernels read: it must live as long as the graph
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, object]] = {}
        pool = _pool()
        with torch.inference_mode():
            for bs in reversed(self.sizes):  # largest first: later graphs reuse its memory
                meta = StepMeta(self.positions[:bs], self.slot_mapping[:bs],
                                self.qo_indptr[:bs + 1], self.page_table[:bs],
                                self.seq_lens[:bs], num_decode=bs, num_requests=bs,
                                max_seq_len=runner.max_model_len)
                batch = ForwardBatch(self.positions[:bs], runner.attention_state(meta))
                step = functools.partial(runner.model, self.input_ids[:bs], batch)
                step()  # warm-up: autotune, allocations
                _sync(dev)
                graph, out = _capture(step, pool)
                self.graphs[bs] = (graph, out, batch)
        _sync(dev)

    def run(self, plan) -> torch.Tensor | None:
        """Hidden states [R, H] of a decode-only plan, or None when no graph fits it."""
        rows = len(plan.request_ids)
        bs = next((s for s in self.sizes if s >= rows), None)
        width = np.asarray(plan.page_table).shape[1]
        if bs is None or width > self.page_table.shape[1]:
            return None

        def put(dst, src):
            dst[:rows].copy_(torch.from_numpy(np.array(src)), non_blocking=True)

        put(self.input_ids, plan.input_ids)
        put(self.positions, plan.positions)
        put(self.slot_mapping, plan.slot_mapping)
        put(self.seq_lens, plan.seq_lens)
        self.page_table[:rows, :width].copy_(torch.from_numpy(np.array(plan.page_table)),
                                             non_blocking=True)
        if bs > rows:
            self.slot_mapping[rows:bs] = -1
            self.seq_lens[rows:bs] = 0
        graph, out, _ = self.graphs[bs]
        graph.replay()
        return out[:rows]
