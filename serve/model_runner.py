"""Executes scheduler plans: plan arrays -> device tensors (once per step) -> model forward ->
logits of the sampling rows -> per-request sampling.

The KV pool is sized from `gpu_memory_utilization` on a GPU (what is left after the weights,
minus an activation reserve) and from `num_kv_pages` / `cpu_kv_cache_gb` on the CPU.
Decode-only steps replay CUDA graphs on a GPU (serve.cuda_graph) and CPU graphs on the CPU
(serve.cpu_graph: tskernels' C++ kernel calls recorded once).

`launch()` enqueues a step and returns a `PendingStep` whose sampled ids come back through a
pinned host buffer and a CUDA event (no device-wide sync); `PendingStep.result()` waits for
that event only. The engine's overlap scheduling does its host work for the previous step while
the device runs this one. Logprobs still copy synchronously (they are rare and larger).
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

import tskernels

from .forward_batch import AttentionState, ForwardBatch, KVPool, StepMeta
from .step_timeline import StepTimeline

log = logging.getLogger(__name__)

SAMPLING_EPS = 1e-5

# tskernels' opt-in backends where they apply, each only where it can run the problem (the
# registry's choice elsewhere): native-dtype GEMMs ("torch_native"), on the CPU the
# weight-streaming fp32 / bf16 GEMM for decode rows ("cpu_stream", when the extension is
# built), fp32 / bf16 norms / SiLU / RoPE in C++ ("cpu_native") and the batched attention
# ("torch_cpu": C++ decode for fp32 / bf16 caches, page gather + SDPA otherwise; not fp8).
SERVE_POLICY = tskernels.KernelPolicy(
    {"gemm.mm": ("cpu_stream", "torch_native"), "gemm.int8w_mm": ("cpu_stream",),
     "gemm.q4w_mm": ("cpu_stream",),
     "norm": ("cpu_native",),
     "activation": ("cpu_native",), "rope": ("cpu_native",), "attention": ("torch_cpu",)},
    name="serve")


def _under_policy(method):
    """Run a runner method with the runner's kernel policy active (every op it calls, also
    the plans it builds, selects under it)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with tskernels.use_backend(self.policy):
            return method(self, *args, **kwargs)
    return wrapper


@dataclass
class SampleRequest:
    """Per-row sampling inputs of one step (rows that sample only)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    step: int
    num_logprobs: int | None


@dataclass
class StepResult:
    token_ids: np.ndarray                      # int32 [R], 0 where the row does not sample
    logprobs: np.ndarray | None                # float32 [S] per sampling row
    top_logprobs: tuple[np.ndarray, np.ndarray] | None  # (values [S, n], ids [S, n])
    sample_rows: np.ndarray                    # int64 [S] plan rows that sampled


class PendingStep:
    """A launched step. `result()` waits for its sampled ids (their copy's event, not the
    device) and returns the StepResult; it may be called once or more."""

    def __init__(self, runner, num_rows: int, sample_rows: np.ndarray, host_ids=None,
                 event=None, done: StepResult | None = None):
        self._runner, self._rows, self._sample_rows = runner, num_rows, sample_rows
        self._host, self._event, self._done = host_ids, event, done

    def result(self) -> StepResult:
        if self._done is None:
            if self._event is not None:
                self._event.synchronize()
            if len(self._sample_rows) == self._rows:   # every row sampled (decode steps)
                token_ids = self._host.numpy().copy()
            else:
                token_ids = np.zeros(self._rows, dtype=np.int32)
                token_ids[self._sample_rows] = self._host.numpy()
            self._done = StepResult(token_ids, None, None, self._sample_rows)
            self._runner.timeline.ids_ready()
        return self._done


class _Subset:
    """The rows `idx` of a launched step's result (a lookahead some of whose rows finished)."""

    def __init__(self, pending: PendingStep, idx: np.ndarray):
        self._pending, self._idx = pending, idx

    def result(self) -> StepResult:
        r = self._pending.result()
        return StepResult(r.token_ids[self._idx], None, None, np.arange(len(self._idx)))


@dataclass
class Lookahead:
    """A decode step launched before the scheduler planned it (ModelRunner.launch_lookahead)."""

    request_ids: np.ndarray   # int64 [R]
    positions: np.ndarray     # int32 [R]
    slots: np.ndarray         # int64 [R]; -1: a row left out (it ended by length)
    pending: PendingStep
    graph_size: Callable[[int], int] | None = None   # rows -> the graph that runs them

    def matches(self, plan):
        """The pending result for `plan` when the lookahead computed it: (PendingStep-like,
        exact) -- exact: the same rows; else the plan's rows are a subset (requests that
        finished or were aborted are gone), read from their lookahead rows -- or None. A
        subset is taken only when the plain loop would replay the same graph for it: every
        row then computes what it would there (rows of one graph do not mix), so lookahead
        changes no token; a subset that falls to a smaller graph is dropped."""
        n = len(plan.request_ids)
        if not n or plan.num_decode != n:
            return None
        rids, pos = np.asarray(plan.request_ids), np.asarray(plan.positions)
        slots = np.asarray(plan.slot_mapping)
        if n == len(self.request_ids) and np.array_equal(rids, self.request_ids):
            ok = np.array_equal(pos, self.positions) and np.array_equal(slots, self.slots)
            return (self.pending, True) if ok else None
        if self.graph_size is not None and \
                self.graph_size(n) != self.graph_size(len(self.request_ids)):
            return None
        idx = np.flatnonzero(np.isin(self.request_ids, rids))
        if len(idx) != n or not np.array_equal(self.request_ids[idx], rids) \
                or not np.array_equal(self.positions[idx], pos) \
                or not np.array_equal(self.slots[idx], slots):
            return None
        return _Subset(self.pending, idx), False


class ModelRunner:
    def __init__(self, model, cfg, args, *, device: torch.device, dtype: torch.dtype,
                 max_model_len: int):
        self.model, self.cfg, self.args = model, cfg, args
        self.device, self.dtype = device, dtype
        self.max_model_len = max_model_len
        self.spec = model.kv_cache_spec()
        kv_dtype = torch.float8_e4m3fn if args.kv_cache_dtype == "fp8_e4m3" else dtype
        if kv_dtype == torch.float8_e4m3fn and isinstance(self.spec, tskernels.GQACacheSpec) \
                and getattr(model, "kv_fp8_ok", True) is False:
            raise ValueError("kv_cache_dtype: fp8 not supported by this model")
        self.page_size = args.page_size
        self.pool = KVPool(self.spec, self._num_pages(kv_dtype) + 1, args.page_size, kv_dtype,
                           device)
        self.mla_scale = self.kv_lora = None
        if isinstance(self.spec, tskernels.MLACacheSpec):
            # one decode / extend plan per step serves every layer: they must agree
            got = {(layer.self_attn.scale, layer.self_attn.kv_lora) for layer in model.layers}
            if len(got) != 1:
                raise ValueError(f"MLA layers with different (softmax scale, kv_lora_rank) "
                                 f"{sorted(got)}: one plan per step cannot serve them")
            (self.mla_scale, self.kv_lora), = got
        self.num_q_heads = cfg.num_attention_heads
        self.policy = SERVE_POLICY
        self.timeline = StepTimeline(device.type == "cuda")
        pinned = device.type == "cuda"
        # two pinned id buffers, alternating: a step's ids never land where the previous
        # step's may still be read
        self._ids_host = [torch.zeros(max(args.max_num_seqs, 1), dtype=torch.int32,
                                      pin_memory=pinned) for _ in range(2)]
        self._ids_flip = 0
        self._ids_events = [torch.cuda.Event() for _ in range(2)] if pinned else None
        self._rows = np.arange(max(args.max_num_seqs, 1))
        self.last_launch_graphed = False
        self.graphs = None
        # autotune: shape capture, and the bounded tuning window before any graph exists
        from tskernels.tuning import engine_start
        engine_start(args.capture_shapes, args.tune_window_s, device)
        graphs = None
        if device.type == "cuda" and args.cuda_graphs:
            from .cuda_graph import CudaGraphs as graphs
        elif device.type == "cpu" and args.cpu_graphs:
            from tskernels import cpu_graph
            if cpu_graph.available():   # (the C++ extension is built)
                from .cpu_graph import CpuGraphs as graphs
        self.warm_extend_plans()   # (a no-op off CUDA)
        if graphs is not None:
            try:
                self.graphs = graphs(self, args.max_num_seqs)
            except Exception as e:  # noqa: BLE001 - an op that cannot be captured: run eagerly
                # a step the CPU recorder refuses (e.g. MoE routing) is expected: info only
                from tskernels.cpu_graph import CaptureError
                level = logging.INFO if isinstance(e, CaptureError) else logging.WARNING
                log.log(level, "%s graphs disabled (%s: %s); decoding eagerly",
                        "CUDA" if device.type == "cuda" else "CPU", type(e).__name__, e)
                self.graphs = None

    # ---- first-use builds ----------------------------------------------------------------
    WARM_PREFIX = 6000   # cached tokens of the warm-up's later-turn-like extend plan

    @_under_policy
    def warm_extend_plans(self) -> bool:
        """Build, without running, the extend plan of a later turn (16 new tokens over a cached
        prefix of WARM_PREFIX tokens or what the context and pool hold; the step's own policy,
        cache and dtype), so that the kernel build it selects (on sm_90 the CUDA paged extend's
        split + GQA-packed cubin, compiled by NVRTC at first use: 128 ms cold on the H200,
        session 19) is made at engine start, not in the first later turn of a session. Nothing
        is launched or kept. False where there is nothing to build this way (a CPU
        runner, an MLA cache, a context under 32 tokens)."""
        pool = self.pool
        if self.device.type != "cuda" or pool.is_mla:
            return False
        new = 16
        total = min(self.WARM_PREFIX + new, self.max_model_len, pool.num_pages * pool.page_size)
        if total < 2 * new:
            return False
        pages = -(-total // pool.page_size)
        dev, i32 = self.device, torch.int32
        tskernels.attention.extend_plan(
            torch.tensor([0, new], dtype=i32, device=dev),
            torch.arange(pages, dtype=i32, device=dev)[None], torch.tensor([total], dtype=i32,
                                                                           device=dev),
            num_q_heads=self.num_q_heads, k_cache=pool.k[0], q_dtype=self.dtype,
            kv_scale_mode="per_tensor" if pool.fp8 else None,
            host_qo_indptr=np.array([0, new]), host_seq_lens=np.array([total]))
        return True

    # ---- pool sizing ---------------------------------------------------------------------
    def _num_pages(self, kv_dtype) -> int:
        a = self.args
        per_page = KVPool.bytes_per_token(self.spec, kv_dtype) * a.page_size
        useful = a.max_num_seqs * math.ceil(self.max_model_len / a.page_size)
        if a.num_kv_pages is not None:
            return a.num_kv_pages
        if self.device.type == "cuda":
            # blocks the allocator caches (e.g. the temporaries of weight loading or dummy
            # initialisation) count as used in mem_get_info: a Qwen3-30B-A3B-sized dummy
            # found no room for its KV cache without this
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = max(2 << 30, int(0.04 * total))  # activations, graphs, sampling
            budget = int(total * a.gpu_memory_utilization) - (total - free) - reserve
            pages = budget // per_page
            if pages < 2:
                raise RuntimeError(
                    f"gpu_memory_utilization={a.gpu_memory_utilization}: no memory left for "
                    f"the KV cache ({budget / 2**30:.2f} GiB; of {total / 2**30:.1f} GiB, "
                    f"{(total - free) / 2**30:.1f} GiB are in use, "
                    f"{torch.cuda.memory_allocated(self.device) / 2**30:.1f} GiB of them "
                    f"by this process's tensors); raise gpu_memory_utilization or give "
                    f"num_kv_pages")
            return int(min(pages, useful))
        pages = int(a.cpu_kv_cache_gb * (1 << 30)) // per_page
        return int(max(2, min(pages, useful)))

    @property
    def num_pages(self) -> int:
        """Pool pages including the null page 0 (what the scheduler is told)."""
        return self.pool.num_pages

    # ---- one step --------------------------------------------------------------------------
    def step_meta(self, plan) -> tuple[torch.Tensor, StepMeta]:
        dev = self.device

        def t(a):
            return torch.from_numpy(np.array(a)).to(dev, non_blocking=True)

        meta = StepMeta(positions=t(plan.positions), slot_mapping=t(plan.slot_mapping),
                        qo_indptr=t(plan.qo_indptr), page_table=t(plan.page_table),
                        seq_lens=t(plan.seq_lens), num_decode=int(plan.num_decode),
                        num_requests=len(plan.request_ids),
                        # the extend plan reads these host copies, not the tensors (no sync)
                        host_qo_indptr=np.array(plan.qo_indptr),
                        host_seq_lens=np.array(plan.seq_lens))
        return t(plan.input_ids), meta

    def attention_state(self, meta: StepMeta) -> AttentionState:
        return AttentionState(self.pool, meta, num_q_heads=self.num_q_heads, q_dtype=self.dtype,
                              mla_scale=self.mla_scale, kv_lora_rank=self.kv_lora)

    @torch.inference_mode()
    @_under_policy
    def forward(self, input_ids: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        batch = ForwardBatch(positions=meta.positions, attention=self.attention_state(meta))
        return self.model(input_ids, batch)

    def run(self, plan, requests: list[SampleRequest | None], process=None) -> StepResult:
        """Execute `plan` and wait for its sampled ids (`launch(...).result()`)."""
        return self.launch(plan, requests, process).result()

    def launch_greedy_decode(self, plan) -> PendingStep:
        """`launch(plan, None, greedy_only=True)` for a decode-only plan whose rows are all
        greedy, with the least host work between two replays: a graph replay selects no kernel
        and records nothing autograd could see, so neither the kernel policy nor inference
        mode is entered (the eager fallback enters both)."""
        num_rows = len(plan.request_ids)
        got = self.graphs.run(plan) if self.graphs is not None else None
        self.last_launch_graphed = got is not None   # (what launch_lookahead may follow)
        if got is None:
            return self.launch(plan, None, greedy_only=True)
        return self._pending(got[1], num_rows, self._rows[:num_rows], graph_step=True)

    def launch_lookahead(self, plan) -> Lookahead | None:
        """Launch the decode step after `plan` (a greedy decode-graph step just launched, ids
        not yet back): every row one token on, its K/V into the slot the scheduler already
        holds for it (`plan.next_slot_mapping`, a page reserved one step early when the token
        opens one: SchedulerConfig.decode_reserve_tokens); a row that ends by length with
        `plan`'s token is left out (a padding row). None when a row goes on without a held
        next slot (its page could not be reserved), no row goes on, or a row would leave the
        graphs' context. What the scheduler plans next is checked against it
        (`Lookahead.matches`) before its ids are used; otherwise they are dropped (its K/V
        writes are the ones the real step makes, into the same slots)."""
        nxt = np.asarray(plan.next_slot_mapping)
        lens = np.asarray(plan.seq_lens)
        go_on = nxt >= 0
        if not self.last_launch_graphed or (nxt == -2).any() or not go_on.any() \
                or int(lens.max()) >= self.max_model_len:
            return None
        rows = len(lens)
        pos = np.where(go_on, lens, 0).astype(np.int32)   # a decode row's next position
        slot = nxt.copy()
        got = self.graphs.run_next(rows, slot, pos, np.where(go_on, lens + 1, 0).astype(np.int32))
        pending = self._pending(got[1], rows, self._rows[:rows], graph_step=True)
        return Lookahead(np.array(plan.request_ids), pos, slot, pending, self.graphs.graph_size)

    @torch.inference_mode()
    @_under_policy
    def launch(self, plan, requests: list[SampleRequest | None] | None, process=None,
               greedy_only: bool = False) -> PendingStep:
        """Enqueue `plan`; `requests[r]` holds row r's sampling inputs (None: no sample).
        process: None, or logits [S, V] of the sampling rows -> processed logits (penalties,
        grammar masks: serve.logits_processing), applied before sampling. Decode-only plans
        replay a CUDA graph when one fits; their sampling too, unless a row asks for logprobs
        or `process` is given. greedy_only: every row is greedy without logprobs (the caller
        knows; `requests` may then be None)."""
        num_rows = len(plan.request_ids)
        sample_rows = np.flatnonzero(np.asarray(plan.sample))
        got = None
        if self.graphs is not None and plan.num_decode == num_rows:
            got = self.graphs.run(plan)
        self.last_launch_graphed = got is not None
        if got is None:
            self.timeline.end(graph_step=False)
        if not len(sample_rows):
            if got is not None:
                self.timeline.end(graph_step=True)
            else:
                self._eager_logits(plan, sample_rows)
            return PendingStep(self, num_rows, sample_rows, done=StepResult(
                np.zeros(num_rows, dtype=np.int32), None, None, sample_rows))
        reqs = None if greedy_only else [requests[r] for r in sample_rows]
        want_lp = not greedy_only and any(r.num_logprobs is not None for r in reqs)
        all_greedy = greedy_only or self._all_greedy(reqs)
        if got is not None:  # the graph computed every row's logits and greedy choice
            logits, greedy = got
            if len(sample_rows) < num_rows:  # (decode rows always sample; kept general)
                sel = torch.from_numpy(sample_rows).to(self.device)
                logits, greedy = logits[sel], greedy[sel]
            elif process is None and not want_lp and not all_greedy:
                greedy = self.graphs.sample(num_rows, *self._param_columns(reqs))
                return self._pending(greedy, num_rows, sample_rows, graph_step=True)
        else:
            logits, greedy = self._eager_logits(plan, sample_rows), None
        if process is not None:
            logits, greedy = process(logits), None
        if not want_lp:
            if greedy is None or not all_greedy:
                greedy = self._sample_ids(logits, reqs)
            return self._pending(greedy, num_rows, sample_rows, graph_step=got is not None)
        self.timeline.end(graph_step=False)
        token_ids = np.zeros(num_rows, dtype=np.int32)
        ids, lp, top = self.sample(logits, reqs)
        token_ids[sample_rows] = ids
        return PendingStep(self, num_rows, sample_rows,
                           done=StepResult(token_ids, lp, top, sample_rows))

    def _pending(self, ids: torch.Tensor, num_rows: int, sample_rows: np.ndarray,
                 graph_step: bool) -> PendingStep:
        """Start the copy of `ids` (int32 [S], device) to a pinned buffer, behind an event."""
        if self.device.type != "cuda":   # a copy: a later replay rewrites the graph's ids
            return PendingStep(self, num_rows, sample_rows, host_ids=ids.to(torch.int32).clone())
        buf = self._ids_host[self._ids_flip][:len(ids)]
        event = self._ids_events[self._ids_flip]
        self._ids_flip ^= 1
        buf.copy_(ids, non_blocking=True)
        event.record()
        self.timeline.end(graph_step=graph_step)
        return PendingStep(self, num_rows, sample_rows, host_ids=buf, event=event)

    @staticmethod
    def _param_columns(reqs: list[SampleRequest]):
        """(temperature, top_k, top_p, min_p, seeds, steps) numpy columns of the rows."""
        return (np.array([r.temperature for r in reqs], np.float32),
                np.array([r.top_k for r in reqs], np.int32),
                np.array([r.top_p for r in reqs], np.float32),
                np.array([r.min_p for r in reqs], np.float32),
                np.array([r.seed for r in reqs], np.int64),
                np.array([r.step for r in reqs], np.int64))

    def _eager_logits(self, plan, sample_rows: np.ndarray) -> torch.Tensor | None:
        """Run the plan's forward; logits of the sampling rows (None when none samples)."""
        input_ids, meta = self.step_meta(plan)
        index = None   # the sampling rows' last tokens (None: every token is one)
        if len(sample_rows):
            last = np.asarray(plan.qo_indptr)[1:][sample_rows] - 1
            if len(last) != len(input_ids) or (last != np.arange(len(last))).any():
                # uploaded before the forward is enqueued, without waiting: a blocking copy
                # behind the forward held the host until the device had run all of it, and the
                # GPU then idled while the logits and sampling were launched
                index = torch.from_numpy(last.astype(np.int64)).to(self.device, non_blocking=True)
        hidden = self.forward(input_ids, meta)
        if not len(sample_rows):
            return None
        # (a decode step sampling every row: no gather)
        return self.model.compute_logits(hidden if index is None else hidden[index])

    @staticmethod
    def _all_greedy(reqs: list[SampleRequest]) -> bool:
        return all(r.num_logprobs is None and r.temperature < SAMPLING_EPS for r in reqs)

    def _sample_ids(self, logits: torch.Tensor, reqs: list[SampleRequest] | None) -> torch.Tensor:
        """Token ids (int32 [S], on logits' device) of the rows, without logprobs (reqs None:
        all greedy)."""
        if reqs is None or self._all_greedy(reqs):
            return tskernels.sampling.greedy(logits).to(torch.int32)
        dev = logits.device
        cols = [torch.from_numpy(c).to(dev, non_blocking=True)
                for c in self._param_columns(reqs)]
        t, k, p, m, seeds, steps = cols
        out = tskernels.sampling.sample(logits, temperature=t, top_k=k, top_p=p, min_p=m,
                                        seeds=seeds, steps=steps)
        return out.token_ids.to(torch.int32)

    def sample(self, logits: torch.Tensor, reqs: list[SampleRequest]):
        """(ids int32 [S], logprobs [S] | None, top logprobs | None) on the host (synchronous)."""
        want = [r.num_logprobs for r in reqs if r.num_logprobs is not None]
        if not want:
            return self._sample_ids(logits, reqs).cpu().numpy(), None, None
        dev = logits.device
        t, k, p, m, seeds, steps = (torch.from_numpy(c).to(dev, non_blocking=True)
                                    for c in self._param_columns(reqs))
        out = tskernels.sampling.sample(logits, temperature=t, top_k=k, top_p=p, min_p=m,
                                        seeds=seeds, steps=steps, num_logprobs=max(want))
        ids = out.token_ids.to(torch.int32).cpu().numpy()
        lp = out.logprobs.float().cpu().numpy()
        top = None
        if out.top_logprobs is not None:
            vals, tids = out.top_logprobs
            top = (vals.float().cpu().numpy(), tids.cpu().numpy())
        return ids, lp, top
