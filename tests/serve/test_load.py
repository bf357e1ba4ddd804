"""The embedded default model (SmolLM2-135M-Instruct on CPU) served by `python -m serve` with
no MODEL argument: a sensible chat answer, and a load test of 32 concurrent streaming clients
for 30 s, some disconnecting mid-stream (and every client hangs up whatever is still streaming
when the 30 s are over), after which the KV pool must be entirely free."""
from __future__ import annotations

import asyncio
import random
import time

import httpx
import openai
import pytest

from serve.metrics import parse_prometheus
from tests.serve.fake_engine import ServerProcess

CLIENTS = 32
DURATION_S = 30.0
QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "What is 2 + 2?",
             "Say hello in Spanish.", "Why is the sky blue?", "Give me a synonym for happy.",
             "What do bees make?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-model-len", "2048")          # no MODEL: the embedded default
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def _metrics(server) -> dict:
    return parse_prometheus(httpx.get(server.url + "/metrics", timeout=30).text)


def test_default_model_answers_sensibly(client):
    model = client.models.list().data[0].id
    assert model == "SmolLM2-135M-Instruct"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == answer


async def _worker(i: int, base_url: str, deadline: float, tally: dict) -> None:
    rng = random.Random(i)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    try:
        while time.monotonic() < deadline:
            disconnect_after = rng.randint(1, 4) if i % 4 == 0 and rng.random() < 0.7 else None
            question = QUESTIONS[rng.randrange(len(QUESTIONS))]
            try:
                stream = await client.chat.completions.create(
                    model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": question}],
                    max_tokens=rng.randint(2, 16), temperature=rng.choice([0.0, 0.8]), stream=True,
                    stream_options={"include_usage": True})
                chunks, finish, usage = 0, None, None
                async for chunk in stream:
                    chunks += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    usage = chunk.usage or usage
                    if disconnect_after is not None and chunks >= disconnect_after:
                        await stream.close()       # hang up mid-stream
                        tally["disconnected"] += 1
                        break
                    if time.monotonic() > deadline:
                        await stream.close()
                        tally["cut_at_end"] += 1
                        break
                else:
                    if finish not in ("stop", "length") or usage is None:
                        tally["errors"].append(f"client {i}: finish={finish} usage={usage}")
                    else:
                        tally["completed"] += 1
                        tally["tokens"] += usage.completion_tokens
            except Exception as e:   # every failure counts; the test wants none
                tally["errors"].append(f"client {i}: {type(e).__name__}: {e}")
    finally:
        await client.close()


def test_load_32_streaming_clients_then_kv_pool_free(server):
    tally = {"completed": 0, "disconnected": 0, "cut_at_end": 0, "tokens": 0, "errors": []}

    async def run():
        deadline = time.monotonic() + DURATION_S
        await asyncio.gather(*(_worker(i, server.base_url, deadline, tally) for i in range(CLIENTS)))

    start = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - start
    assert tally["errors"] == [], tally["errors"][:5]
    assert tally["completed"] > 0 and tally["disconnected"] > 0, tally
    assert tally["completed"] + tally["disconnected"] + tally["cut_at_end"] >= CLIENTS, tally

    deadline = time.monotonic() + 60
    while True:
        m = _metrics(server)
        free = (m["serve_kv_pages_used"] == 0 and m["serve_num_requests_running"] == 0
                and m["serve_num_requests_waiting"] == 0 and m["serve_http_requests_in_flight"] == 0)
        if free or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert free, {k: v for k, v in m.items() if "bucket" not in k}
    assert m["serve_kv_cache_usage_ratio"] == 0
    assert m["serve_kv_pages_total"] > 0
    assert m["serve_time_to_first_token_seconds_count"] >= tally["completed"]
    print(f"\nload: {tally['completed']} completed, {tally['disconnected']} disconnected, "
          f"{tally['cut_at_end']} cut at the end, "
          f"{tally['tokens']} tokens in {elapsed:.1f} s; "
          f"prefix hit rate {m['serve_prefix_cache_hit_rate']:.2f}")
