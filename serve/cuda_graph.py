"""CUDA graphs for decode steps: one graph per padded batch size, captured over static input
buffers (token ids, positions, slots, page table, sequence lengths) whose decode plans were built
once on those same buffers, so a replay only needs the buffers refreshed in place.

A graph runs the whole decode step up to the token choice: the forward, the logits of every row
and their greedy argmax (used when every row is greedy without logprobs). Per size, a second,
small graph samples from those logits (`tskernels.sampling.sample`: temperature / top-k / top-p /
min-p, Philox-seeded per request and step) over static per-row parameter buffers; it is
replayed after the first when a row samples. Logprobs and logits processing (penalties,
grammars) take the graph's logits to the eager sampler. The static inputs are views of one
device buffer mirrored by one pinned host buffer (the sampling parameters: a second pair): a
step fills the host buffer with numpy and uploads it with a single asynchronous copy.

Padding rows get slot -1 (store skipped) and sequence length 0 (attention returns zeros), and
temperature 0 in the sampler. Capture fails loudly if any op synchronises with the host; the
runner then decodes eagerly.
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


# per row, before the page table: int64 slot / page-table patch index, int32 id / pos / len /
# patch page
_HEADER_BYTES = 2 * 8 + 4 * 4


def _inputs(buf: torch.Tensor, max_bs: int, width: int):
    """(slot_mapping int64, input_ids, positions, seq_lens, page_table int32) views of the packed
    byte buffer: the int64 fields first (8-byte aligned), the page table last (it starts at
    _HEADER_BYTES * max_bs)."""
    i64 = buf[:16 * max_bs].view(torch.int64)
    i32 = buf[16 * max_bs:].view(torch.int32)
    ids, pos, lens = (i32[k * max_bs:(k + 1) * max_bs] for k in range(3))
    return i64[:max_bs], ids, pos, lens, i32[4 * max_bs:].view(max_bs, width)


def _table_patch(buf: torch.Tensor, max_bs: int):
    """(flat page-table index int64, page id int32) [max_bs] views of the header: the entries a
    lookahead step writes into the device's page table (CudaGraphs.run_next)."""
    return (buf[8 * max_bs:16 * max_bs].view(torch.int64),
            buf[16 * max_bs:32 * max_bs].view(torch.int32)[3 * max_bs:])


_PARAM_BYTES = 2 * 8 + 4 * 4  # per row: int64 seed / step, fp32 temperature / top_p / min_p, int32 top_k


def _params(buf: torch.Tensor, max_bs: int):
    """(seeds int64, steps int64, temperature f32, top_p f32, min_p f32, top_k int32) views of
    the packed sampling-parameter buffer (the int64 fields first)."""
    i64 = buf[:16 * max_bs].view(torch.int64)
    rest = buf[16 * max_bs:]
    f32, i32 = rest.view(torch.float32), rest.view(torch.int32)
    return (i64[:max_bs], i64[max_bs:], f32[:max_bs], f32[max_bs:2 * max_bs],
            f32[2 * max_bs:3 * max_bs], i32[3 * max_bs:])


class CudaGraphs:
    """The decode graphs of a GPU runner (serve.cpu_graph.CpuGraphs: a CPU runner's). The
    capture hooks (`_capture_step`, `_graph_pool`, `_synchronize`, `_capture_samplers`) are
    what a subclass replaces; the static buffers and their refresh are shared."""

    MAX_BS = 256

    def __init__(self, runner, max_num_seqs: int, max_bs: int | None = None):
        self.runner = runner
        dev = runner.device
        max_bs = min(max_num_seqs, max_bs or self.MAX_BS)
        self.sizes = self._batch_sizes(max_bs)
        # rows -> the graph size that takes them (0: none)
        self._size_of = np.zeros(max_bs + 1, dtype=np.int64)
        for r in range(max_bs, 0, -1):
            self._size_of[r] = next(s for s in self.sizes if s >= r)
        width = math.ceil(runner.max_model_len / runner.page_size)
        self._header, self._row_bytes = _HEADER_BYTES * max_bs, 4 * width
        nbytes = self._header + max_bs * self._row_bytes
        pinned = dev.type == "cuda"
        self._host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned)
        # on the CPU the graphs read the host buffer itself (nothing to upload)
        self._dev = self._host if self.SHARE_HOST else \
            torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        (self.slot_mapping, self.input_ids, self.positions, self.seq_lens,
         self.page_table) = _inputs(self._dev, max_bs, width)
        self._h = [t.numpy() for t in _inputs(self._host, max_bs, width)]
        self._patch_h = [t.numpy() for t in _table_patch(self._host, max_bs)]
        self._patch = _table_patch(self._dev, max_bs)
        self._table_flat = self.page_table.view(-1)
        self._h[0][:] = -1  # padding rows: no K/V store
        self._upload(self._dev, self._host)
        self._uploaded = torch.cuda.Event() if pinned else None
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self._phost = torch.zeros(_PARAM_BYTES * max_bs, dtype=torch.uint8, pin_memory=pinned)
        self._pdev = self._phost if self._dev is self._host else \
            torch.zeros(_PARAM_BYTES * max_bs, dtype=torch.uint8, device=dev)
        self.params = _params(self._pdev, max_bs)
        self._ph = [t.numpy() for t in _params(self._phost, max_bs)]
        self._ph[3][:] = 1.0  # top_p off
        self._upload(self._pdev, self._phost)
        self._params_uploaded = torch.cuda.Event() if pinned else None
        self.timeline = getattr(runner, "timeline", None)
        # per size: the graph, its outputs (logits, greedy ids), and the attention state whose
        # plans (and their split-KV workspaces) the captured kernels read: it must live as long
        # as the graph
        self.graphs: dict[int, tuple[object, tuple[torch.Tensor, torch.Tensor], object]] = {}
        pool = self._graph_pool()
        with torch.inference_mode(), tskernels.use_backend(runner.policy):
            for bs in reversed(self.sizes):  # largest first: later graphs reuse its memory
                meta = StepMeta(self.positions[:bs], self.slot_mapping[:bs],
                                self.qo_indptr[:bs + 1], self.page_table[:bs],
                                self.seq_lens[:bs], num_decode=bs, num_requests=bs,
                                max_seq_len=runner.max_model_len)
                batch = ForwardBatch(self.positions[:bs], runner.attention_state(meta))
                step = functools.partial(_decode_step, runner.model, self.input_ids[:bs], batch)
                step()  # warm-up: autotune, allocations
                self._synchronize(dev)
                graph, out = self._capture_step(step, pool)
                self.graphs[bs] = (graph, out, batch)
            self.samplers: dict[int, tuple[object, torch.Tensor]] = self._capture_samplers(pool)
        self._synchronize(dev)

    # ---- what a subclass replaces ----------------------------------------------------------
    SHARE_HOST = False  # the graphs read the host buffers directly (CPU)

    def _batch_sizes(self, max_bs: int) -> list[int]:
        return graph_batch_sizes(max_bs)

    def _graph_pool(self):
        return _pool()

    def _synchronize(self, dev) -> None:
        _sync(dev)

    def _capture_step(self, step, pool):
        return _capture(step, pool)

    def _capture_samplers(self, pool) -> dict:
        """Per size, the sampler graph over that size's logits. After every forward graph:
        their scratch may reuse the forwards' freed activations (replays are sequential on
        one stream)."""
        samplers = {}
        for bs in reversed(self.sizes):
            logits = self.graphs[bs][1][0]
            step = functools.partial(_sample_step, logits, [t[:bs] for t in self.params])
            step()
            self._synchronize(self.runner.device)
            samplers[bs] = self._capture_step(step, pool)
        return samplers

    @staticmethod
    def _upload(dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.data_ptr() != src.data_ptr():   # (the same buffer on the CPU: SHARE_HOST)
            dst.copy_(src, non_blocking=True)

    def graph_size(self, rows: int) -> int:
        """The captured size that runs `rows` rows (0: none does)."""
        return int(self._size_of[rows]) if 0 <= rows < len(self._size_of) else 0

    def run(self, plan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits [R, V] fp32, greedy token ids [R] int32) of a decode-only plan, on the
        device, or None when no graph fits it."""
        rows = len(plan.request_ids)
        bs = int(self._size_of[rows]) if 0 < rows < len(self._size_of) else 0
        table = np.asarray(plan.page_table)
        width = table.shape[1]
        if not bs or width > self.page_table.shape[1]:
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
        self._upload(self._dev[:n], self._host[:n])
        if self._uploaded is not None:
            self._uploaded.record()
        graph, (logits, greedy), _ = self.graphs[bs]
        if self.timeline is not None:
            self.timeline.begin(bs)
        graph.replay()
        return logits[:rows], greedy[:rows]

    def run_next(self, rows: int, slot: np.ndarray, pos: np.ndarray, lens: np.ndarray):
        """Replay the last replayed graph (same `rows`, the same requests in the same rows) for
        the step after it, launched before that step's ids reached the host: the input ids are
        its greedy ids of the last replay, copied on the device. slot / pos / lens: int64 /
        int32 [rows] of the new tokens (slot -1 and lens 0: a row left out, as padding is).
        A row's slot must lie in a page the scheduler had given it by the plan of the last
        replay (Plan.next_slot_mapping). Returns (logits, greedy ids) like `run`."""
        bs = int(self._size_of[rows])
        if self._uploaded is not None:
            self._uploaded.synchronize()
        h_slot, _, h_pos, h_lens, _ = self._h
        h_slot[:rows], h_pos[:rows], h_lens[:rows] = slot, pos, lens
        # A row whose new token opens a page: its page is in the table `run` uploaded when the
        # scheduler reserved it in that plan, but not when that plan was itself a lookahead
        # (adopted, never uploaded): the device's table is then an older plan's. Its entry is
        # written on the device from the header (a few rows a step; the same value when the
        # table has it already).
        ps = self.runner.page_size
        opens = np.flatnonzero((slot >= 0) & (pos % ps == 0))
        k = len(opens)
        if k:
            h_index, h_page = self._patch_h
            h_index[:k] = opens * self.page_table.shape[1] + pos[opens] // ps
            h_page[:k] = slot[opens] // ps
        # the header only (the ids in it are stale: the device copy below replaces them)
        self._upload(self._dev[:self._header], self._host[:self._header])
        if self._uploaded is not None:
            self._uploaded.record()
        if k:
            index, page = self._patch
            self._table_flat.scatter_(0, index[:k], page[:k])
        graph, (logits, greedy), _ = self.graphs[bs]
        self.input_ids[:rows].copy_(greedy[:rows])
        if self.timeline is not None:
            self.timeline.begin(bs)
        graph.replay()
        return logits[:rows], greedy[:rows]

    def sample(self, rows: int, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
               min_p: np.ndarray, seeds: np.ndarray, steps: np.ndarray) -> torch.Tensor:
        """Token ids (int32 [rows], on the device) drawn from the logits of the graph `run` just
        replayed for `rows` rows; per-row parameters as numpy [rows] arrays (sampling.sample's
        conventions: temperature < 1e-5 is greedy, top_k <= 0 / top_p 1 / min_p 0 are off)."""
        bs = next(s for s in self.sizes if s >= rows)
        if self._params_uploaded is not None:
            self._params_uploaded.synchronize()
        h_seed, h_step, h_t, h_p, h_minp, h_k = self._ph
        h_seed[:rows], h_step[:rows] = seeds, steps
        h_t[:rows], h_p[:rows], h_minp[:rows], h_k[:rows] = temperature, top_p, min_p, top_k
        h_t[rows:bs], h_k[rows:bs], h_p[rows:bs], h_minp[rows:bs] = 0.0, 0, 1.0, 0.0
        # the whole buffer (32 bytes a row) in one copy: cheaper than six partial ones
        self._upload(self._pdev, self._phost)
        if self._params_uploaded is not None:
            self._params_uploaded.record()
        graph, (ids,) = self.samplers[bs]
        graph.replay()
        return ids[:rows]


def _sample_step(logits, params):
    """What a sampler graph records: one draw per row of the forward graph's logits."""
    seeds, steps, temperature, top_p, min_p, top_k = params
    out = tskernels.sampling.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                    min_p=min_p, seeds=seeds, steps=steps)
    return (out.token_ids.to(torch.int32),)


def _decode_step(model, input_ids, batch):
    """What a graph records: forward, logits of every row, their greedy choice."""
    logits = model.compute_logits(model(input_ids, batch))
    return logits, tskernels.sampling.greedy(logits).to(torch.int32)
