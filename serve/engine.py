"""Engine: the C++ scheduler + the model runner + a tokenizer, in-process.

    engine = Engine("default")                         # SmolLM2-135M-Instruct on the CPU
    out = engine.generate(["The capital of France is"], SamplingParams(max_tokens=8))
    for o in engine.stream("Hello", SamplingParams(max_tokens=8)): print(o.new_token_ids)

The server drives it with add_request / step / abort; `step()` runs one scheduler plan and
returns a RequestOutput for every request that produced a token or finished.
"""
from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

import scheduler

from .config import DTYPES, EngineArgs, default_page_size, eos_token_ids, load_model_config
from .model_runner import SAMPLING_EPS, ModelRunner, SampleRequest
from .logits_processing import LogitsProcessing, LogitsState
from .models import model_class, quant
from .sampling_params import GenerateOutput, RequestOutput, SamplingParams
from .weights import build_model

__all__ = ["Engine", "EngineArgs", "GenerateOutput", "RequestOutput", "SamplingParams"]

log = logging.getLogger(__name__)
_SEED_MASK = (1 << 63) - 1


@dataclass
class _Request:
    request_id: str
    sid: int
    prompt_len: int
    params: SamplingParams
    seed: int
    num_generated: int = 0
    done: bool = False
    aborted: bool = False
    logits: LogitsState | None = None     # penalties / logit_bias / grammar, when asked for
    special: bool = False                 # samples, wants logprobs or has a logits state
    cached_tokens: int | None = None      # prefix-cache hit when first scheduled
    error: str | None = None              # why the engine aborted it itself
    outputs: list = field(default_factory=list)
    # time.monotonic() of add_request / first plan it was in / its first token (queue and
    # prefill histograms of /metrics); sent once, on the output with the first token
    arrival: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    timestamps_sent: bool = False


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Engine:
    def __init__(self, model: str = "default", **kwargs):
        args = EngineArgs.from_kwargs(**kwargs)
        self.args = args
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        self.device = _device(args.device)
        hf_cfg, ckpt = load_model_config(model)
        self.hf_config = hf_cfg
        if args.page_size is None:
            args = replace(args, page_size=default_page_size(hf_cfg, self.device))
            self.args = args
        self.model_name = self._name(model, ckpt)
        if args.dtype != "auto":
            self.dtype = DTYPES[args.dtype]
        elif self.device.type == "cpu":
            self.dtype = torch.float32  # the CPU references compute in fp32 anyway
        else:
            self.dtype = torch.bfloat16
        cap = int(getattr(hf_cfg, "max_position_embeddings", 0) or 8192)
        self.max_model_len = args.max_model_len or min(cap, 8192)
        if self.max_model_len > cap:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings {cap}")
        self._tokenizer = self._own_tokenizer(ckpt)
        self.quantization = quant.resolve(args.quantization, device=self.device,
                                          dtype_arg=args.dtype)
        self.model = build_model(model_class(hf_cfg), hf_cfg, device=self.device,
                                 dtype=self.dtype, max_position=self.max_model_len,
                                 checkpoint=ckpt, seed=args.seed,
                                 quantization=self.quantization)
        self.runner = ModelRunner(self.model, hf_cfg, args, device=self.device, dtype=self.dtype,
                                  max_model_len=self.max_model_len)
        self.kv_capacity = (self.runner.num_pages - 1) * args.page_size
        self._fit_context_to_pool(args)
        # tokens per step, decode tokens included (the scheduler bounds both by it)
        self.token_budget = args.chunked_prefill_size or (
            2048 if self.device.type == "cuda" else 512)
        self.eos_token_ids = eos_token_ids(hf_cfg, self._tokenizer, ckpt)
        self._logits = LogitsProcessing(lambda: self.tokenizer, int(hf_cfg.vocab_size),
                                        self.eos_token_ids)
        self.scheduler = scheduler.Scheduler(scheduler.SchedulerConfig(
            num_pages=self.runner.num_pages, page_size=args.page_size,
            max_running=args.max_num_seqs, token_budget=self.token_budget,
            max_context=self.max_model_len, enable_prefix_cache=args.enable_prefix_caching,
            eos_token_ids=self.eos_token_ids))
        self._rng = random.Random(args.seed)
        # overlap scheduling (see step()); a plain attribute, so a benchmark can switch it
        self.overlap_schedule = (self.device.type == "cuda" if args.overlap_schedule is None
                                 else bool(args.overlap_schedule))
        self._inflight = None          # (plan, PendingStep) launched and not yet collected
        # lookahead: with overlap, a greedy decode-graph step's successor is launched before
        # its ids are back (runner.launch_lookahead) and adopted when the scheduler plans it
        la = args.overlap_lookahead
        self.overlap_lookahead = (self.overlap_schedule and self.device.type == "cuda"
                                  if la is None else bool(la))
        self._ahead = None
        self.num_lookahead_steps = self.num_lookahead_dropped = 0
        self._num_special = 0          # live requests that are not plain greedy
        self._gap_at, self._gap = -1.0, {}
        self._ids = itertools.count(1)
        self._requests: dict[str, _Request] = {}
        self._by_sid: dict[int, _Request] = {}
        self.num_generated_tokens = 0
        pool = self.runner.pool
        kv_gib = (pool.num_pages * args.page_size
                  * pool.bytes_per_token(self.runner.spec, pool.dtype)) / 2**30
        log.info("engine ready: %s on %s (%s); max-model-len %d; prefix caching %s; KV pool "
                 "%.3f GiB (%d pages of %d tokens = %d tokens, %s); %d threads; backends: %s",
                 self.model_name, self.device, str(self.dtype).removeprefix("torch.")
                 + (", int8 weights" if self.quantization == "int8" else ""),
                 self.max_model_len, "on" if args.enable_prefix_caching else "off", kv_gib,
                 self.runner.num_pages - 1, args.page_size, self.kv_capacity,
                 str(pool.dtype).removeprefix("torch."), torch.get_num_threads(),
                 self._backends_summary())

    @property
    def overlap_lookahead(self) -> bool:
        """Lookahead launches (see step()); a benchmark may switch it between steps."""
        return self._lookahead

    @overlap_lookahead.setter
    def overlap_lookahead(self, on: bool) -> None:
        self._lookahead = bool(on)
        # the scheduler then hands a decode row the page of its next position one step early
        # (when one is free or evictable), so that a step whose rows open pages can still be
        # looked ahead (Plan.next_slot_mapping)
        self.scheduler.decode_reserve_tokens = int(self._lookahead)

    def _backends_summary(self) -> str:
        """The backend the runner's kernel policy picks for its main ops on this device
        (for the model's dtype; a problem a backend cannot take goes to the next choice)."""
        import tskernels
        fmt = tskernels.fmt(self.dtype)
        picks = []
        with tskernels.use_backend(self.runner.policy):
            for fam, op in (("attention", "decode"), ("attention", "extend"), ("gemm", "mm"),
                            ("norm", "rmsnorm"), ("rope", "apply_rope"),
                            ("activation", "silu_and_mul")):
                try:
                    k = tskernels.select(fam, op, device=self.device, formats={"x": fmt, "q": fmt})
                    picks.append(f"{fam}.{op}={k.backend}")
                except tskernels.SelectionError:
                    picks.append(f"{fam}.{op}=?")
        return ", ".join(picks)

    def _fit_context_to_pool(self, args: EngineArgs) -> None:
        """A context the KV pool cannot hold is never advertised: one request alone would be
        cut with finish_reason "length" far below it. An explicit max_model_len is refused,
        a defaulted one is lowered to the pool's size (and logged)."""
        if self.max_model_len <= self.kv_capacity:
            return
        pool = (f"the KV pool holds {self.kv_capacity} tokens ({self.runner.num_pages - 1} "
                f"pages of {args.page_size})")
        if args.max_model_len is not None:
            raise ValueError(f"max_model_len: {args.max_model_len} tokens do not fit: {pool}; "
                             "give more KV memory (num_kv_pages / gpu_memory_utilization / "
                             "cpu_kv_cache_gb) or a smaller max_model_len")
        log.warning("max_model_len lowered from %d to %d: %s", self.max_model_len,
                    self.kv_capacity, pool)
        self.max_model_len = self.kv_capacity

    @staticmethod
    def _name(model: str, ckpt: str | None) -> str:
        if model == "default":
            return "SmolLM2-135M-Instruct"
        return model if ckpt is None else model.rstrip("/").rsplit("/", 1)[-1]

    @staticmethod
    def _own_tokenizer(ckpt: str | None):
        from transformers import AutoTokenizer

        if ckpt is None:
            return None
        try:
            return AutoTokenizer.from_pretrained(ckpt)
        except (OSError, ValueError, TypeError) as e:
            log.warning("no tokenizer in %s (%s); using the default model's", ckpt, e)
            return None

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer; dummy weights (or a directory without one) get one that
        fits the model's vocabulary (serve.dummy_tokenizer: the default model's, or a byte-level
        one for small vocabularies), loaded on first use."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from .default_model import smollm2_dir
            from .dummy_tokenizer import tokenizer_for
            self._tokenizer = tokenizer_for(int(self.hf_config.vocab_size),
                                            lambda: AutoTokenizer.from_pretrained(smollm2_dir()))
        return self._tokenizer

    # ---- request API ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id: expected a non-empty str, got {request_id!r}")
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
        ids = self._check_prompt(prompt_token_ids)
        logits_state = self._logits.new_state(ids, params)   # ValueError: bad grammar / bias
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        sid = next(self._ids)
        self.scheduler.submit(sid, ids, params.max_tokens, list(params.stop_token_ids),
                              params.ignore_eos, 0)
        special = (logits_state is not None or params.logprobs is not None
                   or params.temperature >= SAMPLING_EPS)
        self._num_special += special
        req = _Request(request_id, sid, len(ids), params, seed & _SEED_MASK, logits=logits_state,
                       special=special,
                       arrival=time.monotonic())
        self._requests[request_id] = req
        self._by_sid[sid] = req

    def _check_prompt(self, ids) -> np.ndarray:
        """The prompt as int32 ids, checked without a Python loop per token (a 50k-token agent
        turn spent ~14 ms here); a list of plain ints takes the scheduler's one-pass C++
        conversion (numpy's took ~2.5 ms of every such turn), other inputs numpy's; the
        per-token loop runs only to name a bad entry."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
            raise ValueError(f"prompt_token_ids: expected a list of ints, got {type(ids).__name__}")
        if len(ids) == 0:
            raise ValueError("prompt_token_ids: empty prompt")
        vocab = self.hf_config.vocab_size
        arr = scheduler.token_array(ids, vocab)   # None: not a list of ints in range
        if arr is None:
            arr = _int_array(ids)
            if arr is None or int(arr.min()) < 0 or int(arr.max()) >= vocab:
                for t in ids:
                    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) \
                            or not 0 <= t < vocab:
                        raise ValueError(f"prompt_token_ids: expected token ids in [0, {vocab}), "
                                         f"got {t!r}")
        limit = self.max_model_len   # <= kv_capacity (_fit_context_to_pool)
        if len(arr) >= limit:
            raise ValueError(f"prompt_token_ids: the prompt has {len(arr)} tokens; it must be "
                             f"shorter than max_model_len ({limit}) to leave room for output")
        return arr.astype(np.int32, copy=False)

    def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is None or req.done:
            raise KeyError(request_id)
        if not req.aborted:  # the "abort" output comes from the next step()
            req.aborted = True
            self.scheduler.abort(req.sid)

    def has_unfinished(self) -> bool:
        return (bool(self._requests) or self.scheduler.has_work()
                or self._inflight is not None)   # (a pending lookahead alone is dropped)

    def step(self) -> list[RequestOutput]:
        """One scheduler step; a RequestOutput for every request that got a token or finished.

        With overlap scheduling (`overlap_schedule`, the default on a GPU) a call collects the step in
        flight (waits for its sampled ids only, advances the scheduler), launches the next
        step, and builds the collected step's outputs while the device runs the new one (so
        does the caller, e.g. the server sending them): outputs arrive one call later, with the
        same tokens in the same order as without it. With `overlap_lookahead` too, a greedy
        decode-graph step's successor is launched right behind it, before its ids are back
        (every row one token on, into the KV slot the scheduler already holds for it, a page
        reserved one step early where the token opens one; ids copied on the device); the next
        call adopts it when the scheduler's plan has the same rows, or a subset of them
        (finished / aborted requests gone), and drops it otherwise."""
        done = []
        if self._inflight is not None:
            done.append(self._collect(self._inflight))
            self._inflight = None
        ahead, self._ahead = self._ahead, None
        if self.scheduler.has_work():
            self._inflight, graph_step = self._launch(ahead)
            if not self.overlap_schedule:
                done.append(self._collect(self._inflight))
                self._inflight = None
            elif graph_step and self._lookahead and not self._num_special \
                    and not self.scheduler.num_waiting:
                # the step after the one just launched, before its ids are back (a request
                # waiting to be admitted would change that plan: not then)
                self._ahead = self.runner.launch_lookahead(self._inflight[0])
        outputs = []
        for d in done:
            outputs += self._outputs(*d)
        return outputs

    def _launch(self, ahead=None):
        """The next plan, enqueued on the device (or found already running: `ahead`, a
        lookahead launch it matches): ((plan, PendingStep or None), whether it is a greedy
        decode-graph step whose successor a lookahead may launch)."""
        plan = self.scheduler.next_plan()
        n = len(plan)
        if not n:
            return (plan, None), False
        if ahead is not None:
            got = ahead.matches(plan)
            if got is not None:
                self.num_lookahead_steps += 1
                return (plan, got[0]), got[1]
            self.num_lookahead_dropped += 1   # its writes are the ones this step repeats
        sids = plan.request_ids
        if plan.num_decode == n and not self._num_special:
            # decode-only and every live request greedy without logprobs / logits processing:
            # nothing per row to prepare (each was scheduled before: its prefill)
            pending = self.runner.launch_greedy_decode(plan)
            return (plan, pending), self.runner.last_launch_graphed
        sample = np.asarray(plan.sample)
        cached = np.asarray(plan.cached_lens)
        seq_lens = np.asarray(plan.seq_lens)
        reqs, states = [], []
        planned_at = time.monotonic()
        for r, s in enumerate(sids.tolist()):
            q = self._by_sid.get(s)
            if q is not None and q.cached_tokens is None:
                q.cached_tokens = int(cached[r])
            if q is not None and q.scheduled_at is None:
                q.scheduled_at = planned_at
            q = q if sample[r] else None
            p = q.params if q is not None else None
            # the Philox step is the number of tokens generated before this one, read from the
            # plan (all tokens - prompt), so it does not wait for the previous step's outputs
            reqs.append(None if q is None else SampleRequest(
                p.temperature, p.top_k, p.top_p, p.min_p, q.seed,
                int(seq_lens[r]) - q.prompt_len, p.logprobs))
            if q is not None:
                states.append(q.logits)
        return (plan, self.runner.launch(plan, reqs, process=self._logits.processor(states))), False

    def _collect(self, launched):
        """Wait for a launched step's ids and advance the scheduler with them; grammar states
        see their token here, before the next step's masks are built."""
        plan, pending = launched
        result = pending.result() if pending is not None else None
        sampled = result.token_ids if result is not None else np.zeros(0, np.int32)
        events = self.scheduler.advance(plan, sampled)
        ran_at = time.monotonic()
        if self._num_special:
            for sid, token, reason in events:
                req = self._by_sid.get(sid)
                if (req is not None and req.logits is not None and token >= 0
                        and reason is None and not req.aborted):
                    req.error = LogitsProcessing.on_token(req.logits, token)
                    if req.error is not None:   # cannot happen with a sound mask; never hang
                        log.error("request %s: %s; aborting it", req.request_id, req.error)
                        self.abort(req.request_id)
        return plan, result, events, ran_at

    def _outputs(self, plan, result, events, ran_at) -> list[RequestOutput]:
        rows = lp_row = None
        if result is not None and result.logprobs is not None:
            rows = {int(s): r for r, s in enumerate(np.asarray(plan.request_ids))}
            lp_row = {int(r): i for i, r in enumerate(result.sample_rows)}
        outputs = []
        for sid, token, reason in events:
            req = self._by_sid.get(sid)
            if req is None:
                continue
            new, lps, tops = [], None, None
            if token >= 0:
                new = [int(token)]
                req.num_generated += 1
                self.num_generated_tokens += 1
                if req.first_token_at is None:
                    req.first_token_at = ran_at
                if lp_row is not None:
                    lps, tops = self._logprobs(req, result, lp_row.get(rows.get(sid, -1)), token)
            if reason is not None:
                self._finish(req)
            outputs.append(RequestOutput(req.request_id, new, lps, tops, reason is not None,
                                         reason, req.prompt_len, req.num_generated,
                                         req.cached_tokens or 0, req.error,
                                         self._timestamps(req, reason is not None)))
        return outputs

    @staticmethod
    def _timestamps(req: _Request, finished: bool) -> dict[str, float] | None:
        """The request's engine-clock timestamps, once: with its first token, or with its last
        output when it never got one (aborted / failed while queued or prefilling)."""
        if req.timestamps_sent or (req.first_token_at is None and not finished):
            return None
        req.timestamps_sent = True
        ts = {"arrival": req.arrival}
        if req.scheduled_at is not None:
            ts["scheduled"] = req.scheduled_at
        if req.first_token_at is not None:
            ts["first_token"] = req.first_token_at
        return ts

    def _logprobs(self, req, result, i, token):
        n = req.params.logprobs
        if n is None or result is None or i is None or result.logprobs is None:
            return None, None
        tops = []
        if n > 0 and result.top_logprobs is not None:
            vals, ids = result.top_logprobs
            tops = [(int(ids[i, j]), float(vals[i, j])) for j in range(n)]
        return [float(result.logprobs[i])], [tops]

    def _finish(self, req: _Request) -> None:
        self._num_special -= req.special
        req.done = True
        self._requests.pop(req.request_id, None)
        self._by_sid.pop(req.sid, None)

    def stats(self) -> dict:
        s = self.scheduler.stats()
        total = s["num_pages"] - 1
        used = total - s["free_pages"] - s["cached_pages"]
        q = s["prefix_query_tokens"]
        return dict(running=s["running"], waiting=s["waiting"], kv_pages_total=total,
                    kv_pages_used=used, kv_usage=used / total if total else 0.0,
                    kv_pages_cached=s["cached_pages"],
                    prefix_hit_rate=s["prefix_hit_tokens"] / q if q else 0.0,
                    prefix_hit_tokens=s["prefix_hit_tokens"], prefix_query_tokens=q,
                    retractions=s["retractions"],
                    num_generated_tokens=self.num_generated_tokens, **self._gap_stats())

    def _gap_stats(self) -> dict:
        """Host gap between decode-graph replays (serve.step_timeline), p50 / p99 over the
        last replays; recomputed at most once a second (stats() goes out with every step)."""
        now = time.monotonic()
        if now - self._gap_at >= 1.0:
            self._gap_at = now
            g = self.runner.timeline.summary()["gpu_gap_us"]
            self._gap = ({} if not g["n"] else
                         {"decode_host_gap_us_p50": g["p50"], "decode_host_gap_us_p99": g["p99"]})
        return self._gap

    def step_timeline(self) -> dict:
        """The step timeline's summary (serve.step_timeline.StepTimeline.summary): GPU gap and
        host preparation time between decode-graph replays, overall and per graph size."""
        return self.runner.timeline.summary()

    # ---- convenience: sync generate and streaming --------------------------------------------
    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        return list(prompt)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[GenerateOutput]:
        """Run prompts (strings or token-id lists) to completion; results in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params: {len(plist)} SamplingParams for {len(prompts)} prompts")
        results, order, detok = {}, [], set()
        for prompt, p in zip(prompts, plist):
            rid = f"gen-{next(self._ids)}"
            ids = self._encode(prompt)
            self.add_request(rid, ids, p)
            results[rid] = GenerateOutput(rid, ids, logprobs=[] if p.logprobs is not None else None,
                                          top_logprobs=[] if p.logprobs is not None else None)
            order.append(rid)
            if p.detokenize:
                detok.add(rid)
        pending = set(order)
        while pending:
            for out in self.step():
                res = results.get(out.request_id)
                if res is None:
                    continue
                self._accumulate(res, out)
                if out.finished:
                    pending.discard(out.request_id)
        for rid in detok:
            res = results[rid]
            res.text = self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        return [results[rid] for rid in order]

    @staticmethod
    def _accumulate(res: GenerateOutput, out: RequestOutput) -> None:
        res.token_ids += out.new_token_ids
        if res.logprobs is not None and out.logprobs:
            res.logprobs += out.logprobs
            res.top_logprobs += out.top_logprobs or []
        if out.finished:
            res.finish_reason = out.finish_reason

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield this request's RequestOutputs as they are produced (other requests in the
        engine advance too; their outputs are not reported here)."""
        rid = f"stream-{next(self._ids)}"
        self.add_request(rid, self._encode(prompt), params or SamplingParams())
        try:
            while True:
                for out in self.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            if rid in self._requests:  # the consumer stopped early: free its pages
                self.abort(rid)
                while rid in self._requests:
                    self.step()


def _int_array(ids) -> np.ndarray | None:
    """ids as an int64 array when every entry is an int or numpy integer (bools excluded);
    None otherwise (the caller's loop then names the bad entry)."""
    if isinstance(ids, np.ndarray):
        return ids.astype(np.int64) if ids.dtype.kind in "iu" and ids.ndim == 1 else None
    types = set(map(type, ids))
    if not all(t is int or (issubclass(t, np.integer) and t is not np.bool_) for t in types):
        return None
    try:
        return np.array(ids, dtype=np.int64)
    except OverflowError:
        return None
