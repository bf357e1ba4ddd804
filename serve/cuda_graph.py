"""CUDA graphs for decode steps: one graph per padded batch size, captured over static input
buffers (token ids, positions, slots, page table, sequence lengths) whose decode plans were built
once on those same buffers, so a replay only needs the buffers refreshed in place.

A graph runs the whole decode step up to the token choice: the forward, the logits of every row
and their greedy argmax (used when every row is greedy without logprobs; otherwise the runner
samples from the graph's logits). The static inputs are views of one device buffer mirrored by
one pinned host buffer: a step fills the host buffer with numpy and uploads it with a single
asynchronous copy, and the greedy tokens come back through a pinned buffer.

Padding rows get slot -1 (store skipped) and sequence length 0 (attention returns zeros).
Capture fails loudly if any op synchronises with the host; the runner then decodes eagerly.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

import tskernels

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


_HEADER_BYTES = 8 + 3 * 4  # per row, before the page table: int64 slot, int32 id / pos / len


def _inputs(buf: torch.Tensor, max_bs: int, width: int):
    """(slot_mapping int64, input_ids, positions, seq_lens, page_table int32) views of the packed
    byte buffer: the int64 slots first (8-byte aligned), the page table last (it starts at
    _HEADER_BYTES * max_bs)."""
    slot = buf[:8 * max_bs].view(torch.int64)
    i32 = buf[8 * max_bs:].view(torch.int32)
    ids, pos, lens = (i32[k * max_bs:(k + 1) * max_bs] for k in range(3))
    return slot, ids, pos, lens, i32[3 * max_bs:].view(max_bs, width)


class CudaGraphs:
    def __init__(self, runner, max_num_seqs: int, max_bs: int = 256):
        self.runner = runner
        dev = runner.device
        max_bs = min(max_num_seqs, max_bs)
        self.sizes = graph_batch_sizes(max_bs)
        width = math.ceil(runner.max_model_len / runner.page_size)
        self._header, self._row_bytes = _HEADER_BYTES * max_bs, 4 * width
        nbytes = self._header + max_bs * self._row_bytes
        pinned = dev.type == "cuda"
        self._host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self._dev = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        (self.slot_mapping, self.input_ids, self.positions, self.seq_lens,
         self.page_table) = _inputs(self._dev, max_bs, width)
        self._h = [t.numpy() for t in _inputs(self._host, max_bs, width)]
        self._h[0][:] = -1  # padding rows: no K/V store
        self._dev.copy_(self._host)
        self._uploaded = torch.cuda.Event() if pinned else None
        self._ids_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=pinned)
        self._ids_ready = torch.cuda.Event() if pinned else None
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        # per size: the graph, its outputs (logits, greedy ids), and the attention state whose
        # plans (and their split-KV workspaces) the captured kernels read: it must live as long
        # as the graph
        self.graphs: dict[int, tuple[object, tuple[torch.Tensor, torch.Tensor], object]] = {}
        pool = _pool()
        with torch.inference_mode(), tskernels.use_backend(runner.policy):
            for bs in reversed(self.sizes):  # largest first: later graphs reuse its memory
                meta = StepMeta(self.positions[:bs], self.slot_mapping[:bs],
                                self.qo_indptr[:bs + 1], self.page_table[:bs],
                                self.seq_lens[:bs], num_decode=bs, num_requests=bs,
                                max_seq_len=runner.max_model_len)
                batch = ForwardBatch(self.positions[:bs], runner.attention_state(meta))
                step = functools.partial(_decode_step, runner.model, self.input_ids[:bs], batch)
                step()  # warm-up: autotune, allocations
                _sync(dev)
                graph, out = _capture(step, pool)
                self.graphs[bs] = (graph, out, batch)
        _sync(dev)

    def run(self, plan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits [R, V] fp32, greedy token ids [R] int32) of a decode-only plan, on the
        device, or None when no graph fits it."""
        rows = len(plan.request_ids)
        bs = next((s for s in self.sizes if s >= rows), None)
        table = np.asarray(plan.page_table)
        width = table.shape[1]
        if bs is None or width > self.page_table.shape[1]:
            return None
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the previous upload has left the host buffer
        slot, ids, pos, lens, pt = self._h
        slot[:rows] = plan.slot_mapping
        ids[:rows] = plan.input_ids
        pos[:rows] = plan.positions
        lens[:rows] = plan.seq_lens
        slot[rows:bs] = -1
        lens[rows:bs] = 0
        pt[:rows, :width] = table
        n = self._header + rows * self._row_bytes
        self._dev[:n].copy_(self._host[:n], non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record()
        graph, (logits, greedy), _ = self.graphs[bs]
        graph.replay()
        return logits[:rows], greedy[:rows]

    def fetch_ids(self, ids: torch.Tensor) -> np.ndarray:
        """Copy the graph's greedy ids to the host through a pinned buffer (waits for them)."""
        out = self._ids_host[:len(ids)]
        out.copy_(ids, non_blocking=True)
        if self._ids_ready is not None:
            self._ids_ready.record()
            self._ids_ready.synchronize()
        return out.numpy().copy()


def _decode_step(model, input_ids, batch):
    """What a graph records: forward, logits of every row, their greedy choice."""
    logits = model.compute_logits(model(input_ids, batch))
    return logits, tskernels.sampling.greedy(logits).to(torch.int32)
