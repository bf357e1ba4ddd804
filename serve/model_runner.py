"""Executes scheduler plans: plan arrays -> device tensors (once per step) -> model forward ->
logits of the sampling rows -> per-request sampling.

The KV pool is sized from `gpu_memory_utilization` on a GPU (what is left after the weights,
minus an activation reserve) and from `num_kv_pages` / `cpu_kv_cache_gb` on the CPU.
Decode-only steps replay CUDA graphs on a GPU (see serve.cuda_graph); the CPU runs eagerly.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

import tskernels

from .forward_batch import AttentionState, ForwardBatch, KVPool, StepMeta

log = logging.getLogger(__name__)

SAMPLING_EPS = 1e-5

# tskernels' opt-in backends where they apply, each only where it can run the problem (the
# registry's choice elsewhere): native-dtype GEMMs ("torch_native"), on the CPU the
# weight-streaming fp32 / bf16 GEMM for decode rows ("cpu_stream", when the extension is
# built), fp32 / bf16 norms / SiLU / RoPE in C++ ("cpu_native") and the batched attention
# ("torch_cpu": C++ decode for fp32 / bf16 caches, page gather + SDPA otherwise; not fp8).
SERVE_POLICY = tskernels.KernelPolicy(
    {"gemm.mm": ("cpu_stream", "torch_native"), "gemm.int8w_mm": ("cpu_stream",),
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
            attn = model.layers[0].self_attn
            self.mla_scale, self.kv_lora = attn.scale, attn.kv_lora
        self.num_q_heads = cfg.num_attention_heads
        self.policy = SERVE_POLICY
        self.graphs = None
        if device.type == "cuda" and args.cuda_graphs:
            from .cuda_graph import CudaGraphs
            try:
                self.graphs = CudaGraphs(self, args.max_num_seqs)
            except Exception as e:  # noqa: BLE001 - an op that cannot be captured: run eagerly
                log.warning("CUDA graphs disabled (%s: %s); decoding eagerly",
                            type(e).__name__, e)
                self.graphs = None

    # ---- pool sizing ---------------------------------------------------------------------
    def _num_pages(self, kv_dtype) -> int:
        a = self.args
        per_page = KVPool.bytes_per_token(self.spec, kv_dtype) * a.page_size
        useful = a.max_num_seqs * math.ceil(self.max_model_len / a.page_size)
        if a.num_kv_pages is not None:
            return a.num_kv_pages
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = max(2 << 30, int(0.04 * total))  # activations, graphs, sampling
            budget = int(total * a.gpu_memory_utilization) - (total - free) - reserve
            pages = budget // per_page
            if pages < 2:
                raise RuntimeError(f"gpu_memory_utilization={a.gpu_memory_utilization}: no "
                                   f"memory left for the KV cache ({budget / 2**30:.2f} GiB)")
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
                        num_requests=len(plan.request_ids))
        return t(plan.input_ids), meta

    def attention_state(self, meta: StepMeta) -> AttentionState:
        return AttentionState(self.pool, meta, num_q_heads=self.num_q_heads, q_dtype=self.dtype,
                              mla_scale=self.mla_scale, kv_lora_rank=self.kv_lora)

    @torch.inference_mode()
    @_under_policy
    def forward(self, input_ids: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        batch = ForwardBatch(positions=meta.positions, attention=self.attention_state(meta))
        return self.model(input_ids, batch)

    @torch.inference_mode()
    @_under_policy
    def run(self, plan, requests: list[SampleRequest | None], process=None) -> StepResult:
        """Execute `plan`; `requests[r]` holds row r's sampling inputs (None: no sample).
        process: None, or logits [S, V] of the sampling rows -> processed logits (penalties,
        grammar masks: serve.logits_processing), applied before sampling."""
        num_rows = len(plan.request_ids)
        sample_rows = np.flatnonzero(np.asarray(plan.sample))
        token_ids = np.zeros(num_rows, dtype=np.int32)
        got = None
        if self.graphs is not None and plan.num_decode == num_rows:
            got = self.graphs.run(plan)
        if got is not None:  # the graph computed every row's logits and greedy choice
            logits, greedy = got
            if 0 < len(sample_rows) < num_rows:
                sel = torch.from_numpy(sample_rows).to(self.device)
                logits, greedy = logits[sel], greedy[sel]
        else:
            logits, greedy = self._eager_logits(plan, sample_rows), None
        if not len(sample_rows):
            return StepResult(token_ids, None, None, sample_rows)
        reqs = [requests[r] for r in sample_rows]
        if process is not None:
            logits, greedy = process(logits), None
        if greedy is not None and self._all_greedy(reqs):
            token_ids[sample_rows] = self.graphs.fetch_ids(greedy)
            return StepResult(token_ids, None, None, sample_rows)
        ids, lp, top = self.sample(logits, reqs)
        token_ids[sample_rows] = ids
        return StepResult(token_ids, lp, top, sample_rows)

    def _eager_logits(self, plan, sample_rows: np.ndarray) -> torch.Tensor | None:
        """Run the plan's forward; logits of the sampling rows (None when none samples)."""
        input_ids, meta = self.step_meta(plan)
        hidden = self.forward(input_ids, meta)
        if not len(sample_rows):
            return None
        last = np.asarray(plan.qo_indptr)[1:][sample_rows] - 1
        if len(last) == hidden.shape[0] and (last == np.arange(len(last))).all():
            rows = hidden  # a decode step sampling every row: no gather, no index upload
        else:
            rows = hidden[torch.from_numpy(last.astype(np.int64)).to(self.device)]
        return self.model.compute_logits(rows)

    @staticmethod
    def _all_greedy(reqs: list[SampleRequest]) -> bool:
        return all(r.num_logprobs is None and r.temperature < SAMPLING_EPS for r in reqs)

    def sample(self, logits: torch.Tensor, reqs: list[SampleRequest]):
        want = [r.num_logprobs for r in reqs if r.num_logprobs is not None]
        if self._all_greedy(reqs):
            ids = tskernels.sampling.greedy(logits)
            return ids.to(torch.int32).cpu().numpy(), None, None
        dev = logits.device

        def col(vals, dtype):
            return torch.tensor(vals, dtype=dtype).to(dev, non_blocking=True)

        out = tskernels.sampling.sample(
            logits, temperature=col([r.temperature for r in reqs], torch.float32),
            top_k=col([r.top_k for r in reqs], torch.int32),
            top_p=col([r.top_p for r in reqs], torch.float32),
            min_p=col([r.min_p for r in reqs], torch.float32),
            seeds=col([r.seed for r in reqs], torch.int64),
            steps=col([r.step for r in reqs], torch.int64),
            num_logprobs=max(want, default=0))
        ids = out.token_ids.to(torch.int32).cpu().numpy()
        lp = out.logprobs.float().cpu().numpy() if want else None
        top = None
        if out.top_logprobs is not None:
            vals, tids = out.top_logprobs
            top = (vals.float().cpu().numpy(), tids.cpu().numpy())
        return ids, lp, top
