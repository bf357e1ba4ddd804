"""Queue-time and prefill-time histograms: the engine's per-request timestamps (arrival, first
schedule, first token), their trip over the IPC, and what /metrics makes of them, through the
metrics module, the real Engine in-process, and a real `python -m serve` on loopback."""
from __future__ import annotations

import time

import httpx
import pytest

from serve import ipc
from serve.engine import Engine, SamplingParams
from serve.metrics import ServerMetrics, parse_prometheus
from tests.serve.fake_engine import ServerProcess, tiny_model

PROMPT = [5, 9, 17, 33, 65, 129, 257, 300, 301, 302]
QUEUE, PREFILL = "serve_request_queue_time_seconds", "serve_request_prefill_time_seconds"


def test_observe_engine_timestamps_values():
    m = ServerMetrics("tiny", process_collectors=False)
    m.observe_engine_timestamps({"arrival": 10.0, "scheduled": 10.25, "first_token": 10.75})
    m.observe_engine_timestamps({"arrival": 3.0, "scheduled": 5.0})      # aborted mid-prefill
    m.observe_engine_timestamps({"arrival": 1.0})                        # aborted while queued
    m.observe_engine_timestamps({"arrival": "x", "scheduled": None, "first_token": True})
    text = m.render()
    s = parse_prometheus(text)
    assert f'{QUEUE}_count{{model_name="tiny"}}' in s
    assert s[f"{QUEUE}_count"] == 2 and s[f"{QUEUE}_sum"] == pytest.approx(2.25)
    assert s[f'{QUEUE}_bucket{{le="0.25"}}'] == 1 and s[f'{QUEUE}_bucket{{le="2.5"}}'] == 2
    assert s[f"{PREFILL}_count"] == 1 and s[f"{PREFILL}_sum"] == pytest.approx(0.5)
    assert s[f'{PREFILL}_bucket{{le="0.25"}}'] == 0 and s[f'{PREFILL}_bucket{{le="0.5"}}'] == 1


@pytest.fixture(scope="module")
def engine():
    # one running request at a time: the second one queues behind the first
    return Engine("dummy:tiny-llama", device="cpu", num_kv_pages=64, page_size=4,
                  max_model_len=128, chunked_prefill_size=4, max_num_seqs=1, threads=1)


def test_engine_timestamps_once_in_order(engine):
    t0 = time.monotonic()
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.add_request("b", PROMPT[:6], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    t1 = time.monotonic()
    seen: dict[str, list] = {"a": [], "b": []}
    firsts, a_done = {}, None
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids and o.request_id not in firsts:
                firsts[o.request_id] = o
            seen[o.request_id].append(o.timestamps)
            if o.request_id == "a" and o.finished:
                a_done = time.monotonic()
    t2 = time.monotonic()
    for rid in "ab":
        sent = [ts for ts in seen[rid] if ts is not None]
        assert len(sent) == 1 and firsts[rid].timestamps is sent[0]   # once, with the first token
        ts = sent[0]
        assert set(ts) == {"arrival", "scheduled", "first_token"}
        assert t0 <= ts["arrival"] <= t1 and ts["arrival"] <= ts["scheduled"] <= ts["first_token"] <= t2
    a, b = firsts["a"].timestamps, firsts["b"].timestamps
    # a's 10-token prompt in 4-token chunks: three plans before its first token
    assert a["first_token"] > a["scheduled"]
    # b waits for a to finish (max_num_seqs=1): first scheduled in a plan after a's last
    assert b["scheduled"] >= a_done and b["scheduled"] - b["arrival"] >= a["first_token"] - a["arrival"]
    assert ipc.output_to_dict(firsts["b"])["timestamps"] == b     # what the IPC carries


def test_engine_timestamps_of_a_request_aborted_in_the_queue(engine):
    engine.add_request("run", PROMPT, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine.add_request("queued", PROMPT, SamplingParams(max_tokens=4, temperature=0))
    engine.step()
    engine.abort("queued")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    [last] = [o for o in outs if o.request_id == "queued"]
    assert last.finished and last.finish_reason == "abort" and set(last.timestamps) == {"arrival"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tiny_model(tmp_path_factory), "--max-model-len", "128", "--threads", "1",
                        "--chunked-prefill-size", "16")
    yield srv
    assert srv.stop() == 0


def _metrics(server) -> dict:
    return parse_prometheus(httpx.get(server.url + "/metrics", timeout=30).text)


def test_server_observes_queue_and_prefill_times(server):
    before = _metrics(server)
    assert before[f"{QUEUE}_count"] == 0 and before[f"{PREFILL}_count"] == 0
    body = {"prompt": "one two three four five six seven eight nine ten " * 3, "max_tokens": 3,
            "temperature": 0, "n": 3, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    after = _metrics(server)
    assert after[f"{QUEUE}_count"] == 3 and after[f"{PREFILL}_count"] == 3   # one per choice
    name = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    assert after[f'{QUEUE}_count{{model_name="{name}"}}'] == 3
    queue, prefill = after[f"{QUEUE}_sum"], after[f"{PREFILL}_sum"]
    ttft = after["serve_time_to_first_token_seconds_sum"] - before.get(
        "serve_time_to_first_token_seconds_sum", 0.0)
    # the engine's arrival -> first token lies inside the API's arrival -> first token
    assert 0 <= queue and 0 < prefill and queue + prefill <= ttft + 1e-6
    assert after[f'{PREFILL}_bucket{{le="+Inf"}}'] == 3

