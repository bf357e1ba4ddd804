"""Overlap scheduling, sampling inside the decode graphs, and chunked prefill next to decodes.

CPU tier: the engine's overlap loop (collect step N, launch N+1, then build N's outputs) gives
the same token streams, logprobs and finish reasons as the plain loop, for greedy and seeded
sampling, staggered arrivals and an abort while a step is in flight; so do lookahead launches
(across KV-page boundaries: the scheduler reserves next pages one step early; under page
pressure); the decode graphs' sampler
(a stand-in graph that re-runs the captured step, as in test_cuda_graph_logic) draws the tokens
the eager sampler draws; a later turn's prefill (cached prefix + new tokens) is chunked next to
running decodes: every step keeps every decode and stays within the token budget.
GPU tier: the same equalities with real CUDA graphs, and the step timeline records gaps.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import serve.cuda_graph as cg
import serve.model_runner as mr
from serve.engine import Engine, SamplingParams

KW = dict(device="cpu", dtype="float32", max_num_seqs=8, max_model_len=512, num_kv_pages=256,
          page_size=8)


def _prompts(seed: int, n: int, lo: int = 1, hi: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 400, (int(k),), generator=g).tolist()
            for k in torch.randint(lo, hi, (n,), generator=g)]


def _drive(engine: Engine, prompts, params_list, add_at=None, abort=None):
    """Run requests to completion through engine.step(); request i is added before step
    add_at[i]; abort: (request index, step) aborts it before that step. Returns per request
    (token ids, logprobs, finish reason)."""
    add_at = add_at or [0] * len(prompts)
    got = {i: ([], [], None) for i in range(len(prompts))}
    step = 0
    while step <= max(add_at) or engine.has_unfinished():
        for i, at in enumerate(add_at):
            if at == step:
                engine.add_request(f"r{i}", prompts[i], params_list[i])
        if abort is not None and abort[1] == step:
            engine.abort(f"r{abort[0]}")
        for out in engine.step():
            ids, lps, _ = got[int(out.request_id[1:])]
            ids += out.new_token_ids
            lps += out.logprobs or []
            if out.finished:
                got[int(out.request_id[1:])] = (ids, lps, out.finish_reason)
        step += 1
        assert step < 2000, "engine did not drain"
    return [got[i] for i in range(len(prompts))]


def _same(a, b):
    assert [(t, r) for t, _, r in a] == [(t, r) for t, _, r in b]
    for (_, la, _), (_, lb, _) in zip(a, b):
        torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def engines():
    return Engine("dummy:tiny-llama", **KW, overlap_schedule=False), \
        Engine("dummy:tiny-llama", **KW, overlap_schedule=True)


def test_overlap_greedy_streams_equal(engines):
    plain, overlap = engines
    prompts = _prompts(0, 6)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=e)
              for m, e in zip((12, 3, 20, 1, 7, 15), (True, False, True, True, False, True))]
    add_at = [0, 0, 2, 3, 3, 9]
    a = _drive(plain, prompts, params, add_at)
    b = _drive(overlap, prompts, params, add_at)
    _same(a, b)
    assert [len(t) for t, _, _ in a] == [12, 3, 20, 1, 7, 15] or any(r == "stop" for *_, r in a)
    assert not overlap.has_unfinished() and overlap.stats()["kv_pages_used"] == 0


def test_overlap_sampled_logprobs_and_abort_equal(engines):
    plain, overlap = engines
    prompts = _prompts(1, 5)
    params = [SamplingParams(max_tokens=14, temperature=0.9, top_k=40, top_p=0.9, min_p=0.02,
                             seed=3 + i, ignore_eos=True, logprobs=1 if i == 2 else None)
              for i in range(4)] + [SamplingParams(max_tokens=30, temperature=0.0,
                                                   ignore_eos=True)]
    add_at = [0, 1, 1, 4, 0]
    a = _drive(plain, prompts, params, add_at, abort=(4, 6))
    b = _drive(overlap, prompts, params, add_at, abort=(4, 6))
    # the abort lands one step later in the overlap loop (a step was in flight): same tokens
    # up to where each stream stopped, and the aborted request is reported as aborted
    assert a[4][2] == b[4][2] == "abort"
    n = min(len(a[4][0]), len(b[4][0]))
    assert a[4][0][:n] == b[4][0][:n]
    _same(a[:4], b[:4])
    assert overlap.stats()["kv_pages_used"] == 0


def _fake_graphs(monkeypatch, engine):
    class Rerun:
        def __init__(self, step, out):
            self.step, self.out, self.replays = step, out, 0

        def replay(self):
            with torch.inference_mode():   # a real replay needs no mode; a re-run does
                for dst, src in zip(self.out, self.step()):
                    dst.copy_(src)
            self.replays += 1

    def capture(step, pool):
        out = step()
        return Rerun(step, out), out

    monkeypatch.setattr(cg, "_capture", capture)
    monkeypatch.setattr(cg, "_pool", lambda: None)
    monkeypatch.setattr(cg, "_sync", lambda dev: None)
    engine.runner.graphs = cg.CudaGraphs(engine.runner, KW["max_num_seqs"])
    return engine.runner.graphs


def test_graph_sampler_matches_eager_sampler(monkeypatch, engines):
    plain, _ = engines
    graphed = Engine("dummy:tiny-llama", **KW, overlap_schedule=True)
    graphs = _fake_graphs(monkeypatch, graphed)
    prompts = _prompts(2, 5)
    params = [SamplingParams(max_tokens=10, temperature=t, top_k=k, top_p=p, min_p=m, seed=11 + i,
                             ignore_eos=True)
              for i, (t, k, p, m) in enumerate([(0.7, 0, 1.0, 0.0), (1.2, 20, 1.0, 0.0),
                                                (0.8, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1),
                                                (0.0, 0, 1.0, 0.0)])]
    _same(_drive(plain, prompts, params), _drive(graphed, prompts, params))
    used = {bs: g.replays for bs, (g, _) in graphs.samplers.items()}
    assert sum(used.values()) > 0, used   # the decode steps sampled inside the "graph"


def test_lookahead_launch_streams_equal(monkeypatch, engines):
    """Lookahead (a decode step launched before the scheduler planned it, checked against the
    plan): same greedy streams as the plain loop, through exact matches, rows that finished
    (subset), page boundaries (next pages reserved one step early) and an arrival (a dropped
    lookahead)."""
    plain, _ = engines
    eng = Engine("dummy:tiny-llama", **KW, overlap_schedule=True, overlap_lookahead=True)
    _fake_graphs(monkeypatch, eng)
    prompts = _prompts(7, 6)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
              for m in (30, 9, 25, 4, 17, 30)]
    add_at = [0, 0, 0, 1, 12, 20]
    _same(_drive(plain, prompts, params, add_at), _drive(eng, prompts, params, add_at))
    assert eng.num_lookahead_steps > 10 and eng.num_lookahead_dropped >= 1, (
        eng.num_lookahead_steps, eng.num_lookahead_dropped)
    assert eng.stats()["kv_pages_used"] == 0


def _lookahead_census(monkeypatch, page_size: int) -> dict:
    """Counts the lookaheads checked against a plan whose rows' new tokens open a KV page
    (crossing: the page was reserved one step early), and how many of them were adopted."""
    seen = {"crossing": 0, "crossing_adopted": 0, "checked": 0}
    matches = mr.Lookahead.matches

    def counted(self, plan):
        got = matches(self, plan)
        seen["checked"] += 1
        if ((self.positions % page_size == 0) & (self.slots >= 0)).any():
            seen["crossing"] += 1
            seen["crossing_adopted"] += got is not None
        return got

    monkeypatch.setattr(mr.Lookahead, "matches", counted)
    return seen


def test_lookahead_across_page_boundaries_streams_equal(monkeypatch):
    """Pages of 4 tokens and 8 staggered rows: some row opens a page on most steps. With the
    scheduler reserving each row's next page one step early the lookaheads go on across page
    boundaries (including chains of adopted lookaheads, whose page-table entries are written
    on the device), through rows ending by length and an abort; the token streams equal
    the plain loop's."""
    kw = dict(KW, page_size=4)
    plain = Engine("dummy:tiny-llama", **kw, overlap_schedule=False)
    eng = Engine("dummy:tiny-llama", **kw, overlap_schedule=True, overlap_lookahead=True)
    assert eng.scheduler.decode_reserve_tokens == 1 and plain.scheduler.decode_reserve_tokens == 0
    _fake_graphs(monkeypatch, eng)
    seen = _lookahead_census(monkeypatch, 4)
    prompts = _prompts(9, 8, 3, 30)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
              for m in (40, 23, 37, 9, 31, 40, 18, 26)]
    add_at = [0, 0, 1, 2, 3, 12, 13, 30]
    a = _drive(plain, prompts, params, add_at, abort=(5, 25))
    b = _drive(eng, prompts, params, add_at, abort=(5, 25))
    assert a[5][2] == b[5][2] == "abort"   # (one step later in the overlap loop)
    n = min(len(a[5][0]), len(b[5][0]))
    assert n > 5 and a[5][0][:n] == b[5][0][:n]
    _same(a[:5] + a[6:], b[:5] + b[6:])
    st = eng.scheduler.stats()
    assert st["decode_reservations"] > 20 and st["reservation_misses"] == 0, st
    assert seen["crossing_adopted"] >= 15, seen
    assert eng.num_lookahead_steps >= 35, (eng.num_lookahead_steps, seen)
    assert eng.stats()["kv_pages_used"] == 0


def test_lookahead_under_page_pressure_streams_equal(monkeypatch):
    """A pool too small for every row: reservations miss (the lookahead then waits for the
    real plan), rows are retracted and recompute; same streams as the plain loop with the
    same pool (no prefix cache: both loops then plan the same batches)."""
    kw = dict(KW, page_size=4, num_kv_pages=36, max_model_len=128, enable_prefix_caching=False)
    plain = Engine("dummy:tiny-llama", **kw, overlap_schedule=False)
    eng = Engine("dummy:tiny-llama", **kw, overlap_schedule=True, overlap_lookahead=True)
    _fake_graphs(monkeypatch, eng)
    prompts = _prompts(10, 6, 10, 30)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
              for m in (30, 22, 35, 12, 28, 30)]
    add_at = [0, 0, 1, 2, 4, 6]
    _same(_drive(plain, prompts, params, add_at), _drive(eng, prompts, params, add_at))
    st, st_plain = eng.scheduler.stats(), plain.scheduler.stats()
    assert st["reservation_misses"] > 0 and st["retractions"] > 0, st
    assert st["retractions"] == st_plain["retractions"], (st, st_plain)
    assert eng.num_lookahead_steps > 0
    assert eng.stats()["kv_pages_used"] == 0


def test_later_turn_prefill_interleaves_with_decodes():
    """A later turn (its first turn's prompt + output cached, then new tool tokens) prefills in
    chunks of the token budget while two requests decode: each of its steps carries both
    decodes, never more tokens than the budget, and the decodes get a token every step."""
    budget = 48
    eng = Engine("dummy:tiny-llama", **KW, chunked_prefill_size=budget)
    greedy = dict(temperature=0.0, ignore_eos=True)
    turn1 = _prompts(3, 1, 200, 201)[0]
    first = eng.generate([turn1], SamplingParams(max_tokens=8, **greedy))[0]
    later = turn1 + first.token_ids + _prompts(4, 1, 160, 161)[0]   # ~160 new tokens
    plans = []
    launch, greedy_decode = eng.runner.launch, eng.runner.launch_greedy_decode

    inside = []

    def spy(plan, *a, **k):
        if not inside:
            plans.append((int(plan.num_decode), len(plan.input_ids), len(plan.request_ids)))
        return launch(plan, *a, **k)

    def spy_greedy(plan):   # all-greedy decode steps (a CPU graph replay: not through launch)
        plans.append((int(plan.num_decode), len(plan.input_ids), len(plan.request_ids)))
        inside.append(1)
        try:
            return greedy_decode(plan)   # (its eager fallback calls launch: counted once)
        finally:
            inside.pop()

    eng.runner.launch, eng.runner.launch_greedy_decode = spy, spy_greedy
    for i, p in enumerate(_prompts(5, 2, 5, 10)):
        eng.add_request(f"d{i}", p, SamplingParams(max_tokens=60, **greedy))
    while len(plans) < 3:   # both decoding
        eng.step()
    start = len(plans)
    eng.add_request("later", later, SamplingParams(max_tokens=4, **greedy))
    outs, steps = {}, 0
    while eng.has_unfinished():
        for o in eng.step():
            outs.setdefault(o.request_id, []).append(steps)
        steps += 1
    mixed = [p for p in plans[start:] if p[2] > p[0]]   # steps with a prefill chunk
    assert len(mixed) >= 3, plans[start:]               # the new tokens took several chunks
    for num_decode, tokens, _ in mixed:
        assert num_decode == 2 and tokens <= budget, (num_decode, tokens)
    assert sum(t - d for d, t, _ in mixed) < len(later) - 100   # the cached prefix was reused
    # the decodes advanced on every step while "later" was prefilling
    first_later = outs["later"][0]
    for rid in ("d0", "d1"):
        got = [s for s in outs[rid] if s <= first_later]
        assert got == list(range(got[0], first_later + 1))[-len(got):], (rid, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_overlap_and_graph_sampling_equal():
    # no prefix cache: every drive starts from the same state (a prompt cached by an earlier
    # drive takes the extend path, whose bf16 rounding differs from a full prefill's, and the
    # random dummy model's near-tied logits then flip a greedy token)
    kw = dict(device="cuda", dtype="bfloat16", max_num_seqs=16, max_model_len=512,
              num_kv_pages=512, page_size=16, enable_prefix_caching=False)
    plain = Engine("dummy:tiny-llama", **kw, overlap_schedule=False)
    overlap = Engine("dummy:tiny-llama", **kw, overlap_schedule=True)
    ahead = Engine("dummy:tiny-llama", **kw, overlap_schedule=True, overlap_lookahead=True)
    assert overlap.runner.graphs is not None, "CUDA graph capture failed (see the log)"
    prompts = _prompts(6, 12)
    greedy = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * 12
    add_at = [0] * 6 + [3] * 6
    a = _drive(plain, prompts, greedy, add_at)
    b = _drive(overlap, prompts, greedy, add_at)
    _same(a, b)
    tl = overlap.step_timeline()
    assert tl["gpu_gap_us"]["n"] > 10 and tl["gpu_gap_us"]["p50"] > 0, tl
    # lookahead launches: all rows finish together (a subset of rows would replay a larger
    # graph than the plain loop, whose bf16 GEMMs may round differently; the CPU test covers it)
    same = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)] * 12
    _same(_drive(plain, prompts, same), _drive(ahead, prompts, same))
    # a row opening a page no longer blocks the lookahead (its page is reserved a step early;
    # before that, 17 of the 40 decode steps ran ahead on the H200)
    assert ahead.num_lookahead_steps >= 10, ahead.num_lookahead_steps
    assert ahead.scheduler.stats()["decode_reservations"] > 0
    # seeded sampling inside the decode graphs, and the same draws by the eager sampler on
    # the graphs' logits (logprobs=0 takes that path); a graph-free engine is not compared
    # exactly: its bf16 logits differ in the last bits, and so can a draw
    sampled = [dict(max_tokens=24, temperature=0.8, top_k=50, top_p=0.95, min_p=0.01,
                    seed=100 + i, ignore_eos=True) for i in range(12)]
    c = _drive(overlap, prompts, [SamplingParams(**p) for p in sampled], add_at)
    d = _drive(plain, prompts, [SamplingParams(logprobs=0, **p) for p in sampled], add_at)
    assert [t for t, _, _ in c] == [t for t, _, _ in d]
    assert len({tuple(t) for t, _, _ in c}) > 1


def test_lookahead_subset_only_within_its_graph():
    """A lookahead computed for 4 rows (graph of 4) is adopted for 3 of them (the plain loop
    would replay the graph of 4 too) but dropped for 2 (the plain loop replays the graph of
    2, whose GEMMs need not round the same way): a lookahead changes no token."""
    from types import SimpleNamespace

    from serve.model_runner import Lookahead
    sizes = {1: 1, 2: 2, 3: 4, 4: 4}
    ahead = Lookahead(np.array([5, 6, 7, 8]), np.array([10, 11, 12, 13], dtype=np.int32),
                      np.array([100, 101, 102, 103]), pending="P", graph_size=sizes.__getitem__)

    def plan(idx):
        idx = list(idx)
        return SimpleNamespace(request_ids=ahead.request_ids[idx], num_decode=len(idx),
                               positions=ahead.positions[idx], slot_mapping=ahead.slots[idx])

    assert ahead.matches(plan([0, 1, 2, 3])) == ("P", True)
    got = ahead.matches(plan([0, 2, 3]))
    assert got is not None and got[1] is False and list(got[0]._idx) == [0, 2, 3]
    assert ahead.matches(plan([1, 3])) is None           # falls to the graph of 2: dropped
    moved = plan([0, 2, 3])
    moved.positions = moved.positions + 1                # not what the lookahead computed
    assert ahead.matches(moved) is None


def test_lookahead_default_follows_overlap_on_a_gpu_only(engines):
    """overlap_lookahead=None: on where overlap scheduling is on a GPU; on the CPU an overlap
    engine keeps it off, and with it the scheduler's page reservation."""
    plain, overlap = engines
    for eng in (plain, overlap):
        assert eng.overlap_lookahead is False and eng.scheduler.decode_reserve_tokens == 0
    on = Engine("dummy:tiny-llama", **KW, overlap_schedule=True, overlap_lookahead=True)
    assert on.overlap_lookahead is True and on.scheduler.decode_reserve_tokens == 1
