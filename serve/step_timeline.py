"""The step timeline: how long the GPU idles between two decode-graph replays (the host gap).

Every decode step that replays a CUDA graph records a CUDA event right before the replay
(after its metadata upload is enqueued) and one after its last device work (the sampled ids'
copy to the host). The gap of step N+1 is the GPU time from step N's end event to step N+1's
begin event: the host work that was not hidden behind the GPU (reading the sampled ids,
`Scheduler.advance`, the next plan, filling the static buffers, launching the replay) plus the
metadata upload copy. A step that runs eagerly (prefill, logprobs, logits processing) breaks
the chain: the gap after it is not a gap between replays and is not counted. With lookahead
launches (Engine.overlap_lookahead) step N+1 is enqueued before step N's ids are read: its
begin event then follows step N's end with no host work between them on the stream.

Events are resolved lazily, one step later, when both have completed (never a device sync).
On the CPU (no events) the timeline stays empty. Gaps are kept per graph batch size, the last
`keep` of each, in microseconds; `summary()` gives percentiles.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch


class StepTimeline:
    def __init__(self, enabled: bool, keep: int = 4096):
        self.enabled = enabled
        self.keep = keep
        self._gaps: dict[int, deque] = {}        # graph batch size -> GPU gaps (us)
        self._host: dict[int, deque] = {}        # graph batch size -> host prep (us)
        self._prev_end = None                     # end event of the previous graph step
        self._open: deque = deque()               # (end_prev, begin, bs) awaiting resolution
        self._ids_ready_at: float | None = None   # perf_counter when the last ids were read
        self._begin = None
        self._bs = 0
        # events are reused round-robin (one is resolved a step after it is recorded); new
        # ones each step would cost their creation inside the gap being measured
        self._ring = [torch.cuda.Event(enable_timing=True) for _ in range(16)] if enabled else []
        self._next = 0

    def _event(self):
        ev = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        ev.record()
        return ev

    def begin(self, bs: int) -> None:
        """Called right before a decode-graph replay of batch size `bs`."""
        if not self.enabled:
            return
        ev = self._event()
        if self._ids_ready_at is not None:   # host time since the last ids arrived
            us = (time.perf_counter() - self._ids_ready_at) * 1e6
            self._ids_ready_at = None
            self._host.setdefault(bs, deque(maxlen=self.keep)).append(us)
        if self._prev_end is not None:
            self._open.append((self._prev_end, ev, bs))
        self._begin, self._bs = ev, bs

    def end(self, graph_step: bool) -> None:
        """Called after a step's last device work is enqueued; `graph_step`: the step replayed
        a decode graph (else the chain of replays is broken)."""
        if not self.enabled:
            return
        if not graph_step or self._begin is None:
            self._prev_end = self._begin = None
            self._ids_ready_at = None
            self._open.clear()   # (their events would be re-recorded before they resolve)
            return
        self._prev_end, self._begin = self._event(), None

    def ids_ready(self) -> None:
        """Called when a step's sampled ids reached the host (its events have completed)."""
        if not self.enabled:
            return
        self._ids_ready_at = time.perf_counter()
        # pairs whose later event has completed (a lookahead launch may have recorded the
        # next begin before these ids arrived: it stays open until it ran)
        while self._open and self._open[0][1].query():
            end_prev, begin, bs = self._open.popleft()
            us = end_prev.elapsed_time(begin) * 1e3
            self._gaps.setdefault(bs, deque(maxlen=self.keep)).append(us)

    def reset(self) -> None:
        self._gaps.clear()
        self._host.clear()
        self._open.clear()

    @staticmethod
    def _stats(values) -> dict:
        a = np.asarray(values, dtype=np.float64)
        if not len(a):
            return {"n": 0}
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"n": int(len(a)), "mean": float(a.mean()), "p50": float(p50),
                "p90": float(p90), "p99": float(p99)}

    def summary(self) -> dict:
        """{"gpu_gap_us": stats over all sizes, "host_prep_us": ..., "by_batch": {bs: {...}}}
        (stats: n, mean, p50, p90, p99 in microseconds)."""
        all_gaps = [g for d in self._gaps.values() for g in d]
        all_host = [h for d in self._host.values() for h in d]
        by = {bs: {"gpu_gap_us": self._stats(self._gaps.get(bs, ())),
                   "host_prep_us": self._stats(self._host.get(bs, ()))}
              for bs in sorted(set(self._gaps) | set(self._host))}
        return {"gpu_gap_us": self._stats(all_gaps), "host_prep_us": self._stats(all_host),
                "by_batch": by}
