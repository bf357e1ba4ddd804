"""CPU graphs for decode steps: serve.cuda_graph's static buffers and per-size steps, recorded
with `tskernels.CPUGraph` instead of a CUDA graph.

On the CPU a decode step of the default model is ~400 C++ kernel calls; run eagerly, the Python
around them (30 layers of module calls, wrappers, allocations) took as long as the kernels
(benchmarks/RESULTS.md, issue 22). A replay runs the recorded kernel calls back to back in C++,
with the few torch ops of the step (the embedding lookup, the greedy argmax) replayed in their
places.

Differences from the GPU's graphs:
- sizes 1, 2, 3, 4, 6, 8, 12, 16 rows, at most 16: the decode-row kernels' range (above it the
  GEMMs go to torch.mm, compute-bound, where Python costs little). Every captured tensor is
  kept with its graph (no shared pool on the CPU): 1.4 MiB per row for the default model, 72 MiB
  for all eight sizes;
- the graphs read the host buffers themselves (nothing to upload);
- no sampler graph: a sampled row's token is drawn by the eager sampler from the graph's logits
  (the greedy choice of every row is in the graph).
A capture that records something a replay cannot repeat (`tskernels.cpu_graph.CaptureError`:
a host value, a value-dependent shape such as the MoE models' expert grouping), or a replay
that differs from the eager step on fresh inputs (`_check`, at start), leaves the runner
decoding eagerly, as a failed CUDA capture does.
"""
from __future__ import annotations

import numpy as np
import torch

import tskernels

from tskernels.cpu_graph import CaptureError

from .cuda_graph import CudaGraphs, _decode_step

CPU_GRAPH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


class CpuGraphs(CudaGraphs):
    MAX_BS = CPU_GRAPH_SIZES[-1]
    SHARE_HOST = True

    def __init__(self, runner, max_num_seqs: int, max_bs: int | None = None):
        super().__init__(runner, max_num_seqs, max_bs)
        for bs in self.sizes:
            self._check(bs)

    def _check(self, bs: int) -> None:
        """Replay against the eager step on inputs unlike the capture's (which had every row
        empty): tokens, positions and lengths 1..page_size in the null page 0, cleared before
        each run. A difference means the step depends on something the capture froze (a host
        read the dispatcher cannot see); CaptureError then, and the runner decodes eagerly."""
        r = self.runner
        graph, (logits, greedy), batch = self.graphs[bs]
        slot, ids, pos, lens, table = self._h
        rng = np.random.default_rng(bs)
        n = min(r.page_size, r.max_model_len)
        lens[:bs] = rng.integers(1, n + 1, bs)
        pos[:bs] = lens[:bs] - 1
        slot[:bs] = pos[:bs]   # page 0, the scheduler's null page: never handed out
        table[:bs, 0] = 0
        ids[:bs] = rng.integers(0, r.cfg.vocab_size, bs)
        pages = [r.pool.kv] if r.pool.is_mla else [r.pool.k, r.pool.v]
        try:
            with torch.inference_mode():
                for p in pages:
                    p[:, 0].zero_()
                graph.replay()
                got = logits.clone(), greedy.clone()
                for p in pages:
                    p[:, 0].zero_()
                with tskernels.use_backend(r.policy):
                    want = _decode_step(r.model, self.input_ids[:bs], batch)
        finally:
            slot[:bs], lens[:bs] = -1, 0
        same = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got, want))
        if not same:
            raise CaptureError(f"the {bs}-row CPU graph's replay differs from the eager step "
                               f"(the step reads something a capture cannot see change)")

    def _batch_sizes(self, max_bs: int) -> list[int]:
        return sorted({s for s in CPU_GRAPH_SIZES if s < max_bs} | {max_bs})

    def _graph_pool(self):
        return None

    def _synchronize(self, dev) -> None:
        pass

    def _capture_step(self, step, pool):
        graph = tskernels.CPUGraph()
        with graph.capture():
            out = step()
        return graph, out

    def _capture_samplers(self, pool) -> dict:
        return {}

    def sample(self, rows: int, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
               min_p: np.ndarray, seeds: np.ndarray, steps: np.ndarray) -> torch.Tensor:
        """As CudaGraphs.sample: ids drawn from the logits of the graph `run` just replayed,
        by the eager sampler (the same op the sampler graph records on a GPU)."""
        logits = self.graphs[int(self._size_of[rows])][1][0]
        col = torch.from_numpy
        out = tskernels.sampling.sample(logits[:rows], temperature=col(temperature),
                                        top_k=col(top_k), top_p=col(top_p), min_p=col(min_p),
                                        seeds=col(seeds), steps=col(steps))
        return out.token_ids.to(torch.int32)
