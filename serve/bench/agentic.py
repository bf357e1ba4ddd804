"""Replay agent sessions against an OpenAI-compatible server and measure what the user feels.

Each concurrency point runs up to `concurrency` sessions at once (closed loop: a finished
session makes room for the next; with `arrival_rate` > 0 sessions also arrive as a Poisson
process). A session's turns run one after another, each waiting its think time first. A point
ends when its sessions are done or `duration_s` has passed (no new turn starts after it; turns
in flight get `grace_s` more, then are cancelled and counted as "cancelled").
"""
from __future__ import annotations

import asyncio
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from .client import RequestRecord, scrape_metrics, stream_chat
from .report import summarize
from .sessions import Session


@dataclass
class RunConfig:
    url: str
    model: str | None = None
    duration_s: float = 600.0
    grace_s: float = 60.0
    arrival_rate: float = 0.0          # sessions per second; 0 = all eligible at once
    request_timeout_s: float = 600.0
    temperature: float = 0.0
    ignore_eos: bool = True
    num_gpus: int = 1
    api_key: str | None = None
    seed: int = 0
    endpoint: str = "chat"              # or "completions" (the conversation as plain text)

    @property
    def headers(self) -> dict | None:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None


async def _model_id(client: httpx.AsyncClient, cfg: RunConfig) -> str:
    if cfg.model:
        return cfg.model
    resp = await client.get(cfg.url.rstrip("/") + "/v1/models", headers=cfg.headers, timeout=30)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{cfg.url}/v1/models lists no model; pass --model")
    return data[0]["id"]


async def _run_session(client, cfg: RunConfig, model: str, session: Session, deadline: float,
                       records: list[RequestRecord]) -> None:
    history: list[dict] = []
    for t, turn in enumerate(session.turns):
        if turn.think_time_s:
            await asyncio.sleep(min(turn.think_time_s, max(0.0, deadline - time.perf_counter())))
        if time.perf_counter() >= deadline:
            return
        history += turn.new_messages
        rec = RequestRecord(session=session.id, turn=t, sent=time.perf_counter())
        records.append(rec)
        try:
            await stream_chat(client, cfg.url, model, list(history), turn.max_tokens, rec,
                              ignore_eos=cfg.ignore_eos, temperature=cfg.temperature,
                              timeout_s=cfg.request_timeout_s, headers=cfg.headers,
                              endpoint=cfg.endpoint)
        except asyncio.CancelledError:
            rec.error = "cancelled"
            raise
        if not rec.ok:
            return                      # a failed turn ends its session: the history is broken
        history.append({"role": "assistant", "content": rec.text})


async def run_point(cfg: RunConfig, sessions: list[Session], concurrency: int) -> dict:
    """Run `sessions` with at most `concurrency` at once; returns summarize()'s metrics."""
    if concurrency < 1:
        raise ValueError(f"concurrency: expected >= 1, got {concurrency}")
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        model = await _model_id(client, cfg)
        before = await scrape_metrics(client, cfg.url, cfg.headers)
        rng = random.Random(cfg.seed)
        sem = asyncio.Semaphore(concurrency)
        start = time.perf_counter()
        deadline = start + cfg.duration_s

        async def one(session: Session, arrival: float):
            await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
            async with sem:
                if time.perf_counter() < deadline:
                    await _run_session(client, cfg, model, session, deadline, records)

        arrival, tasks = start, []
        for s in sessions:
            tasks.append(asyncio.create_task(one(s, arrival)))
            if cfg.arrival_rate > 0:
                arrival += rng.expovariate(cfg.arrival_rate)
        done, pending = await asyncio.wait(tasks, timeout=cfg.duration_s + cfg.grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        wall = time.perf_counter() - start
        after = await scrape_metrics(client, cfg.url, cfg.headers)
    for r in records:
        if r.error is None and r.first_token is None and r.finish_reason is None:
            r.error = "cancelled"
    metrics = summarize(records, wall, num_gpus=cfg.num_gpus, server_before=before or None,
                        server_after=after or None)
    return {"concurrency": concurrency, "model": model, "metrics": metrics}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`python -m serve ARGS` on a free loopback port, up until the `with` block ends."""

    def __init__(self, args: str | list[str], *, startup_timeout_s: float = 600.0,
                 log_path: str | None = None):
        self.args = shlex.split(args) if isinstance(args, str) else list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.timeout = startup_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LocalServer":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        cmd = [sys.executable, "-m", "serve", *self.args, "--host", "127.0.0.1",
               "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was "
                                   f"healthy: {' '.join(cmd)}" + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise TimeoutError(f"server not healthy after {self.timeout:.0f} s: {' '.join(cmd)}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sweep(cfg: RunConfig, make_sessions, concurrencies: list[int], label: str,
          progress=print, on_point=None) -> dict:
    """One run: every concurrency point with fresh sessions from `make_sessions(concurrency)`;
    `on_point(run so far)` after each point (partial results survive a cut-off run)."""
    points = []
    for c in concurrencies:
        t0 = time.perf_counter()
        point = asyncio.run(run_point(cfg, make_sessions(c), c))
        m = point["metrics"]
        progress(f"[{label}] concurrency {c}: {m['ok']}/{m['requests']} requests ok in "
                 f"{time.perf_counter() - t0:.1f} s")
        points.append(point)
        if on_point is not None:
            on_point({"label": label, "points": points})
    return {"label": label, "points": points}
