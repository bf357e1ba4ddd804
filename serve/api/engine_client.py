"""API-process side of the ZMQ link: starts the engine process, routes its outputs to requests.

One `RequestGroup` per HTTP request holds the engine requests behind it (n choices x prompts)
and one queue their outputs land in. Closing a group aborts whatever is unfinished, which is
how a disconnected client's KV pages get freed. If the engine process dies, every open group
receives `EngineDeadError` and `on_engine_death` fires (the CLI shuts the server down).

One API request is one "add" message (all its engine requests) and its close one "abort"
message. Admission control: `max_pending` bounds the engine requests in flight (running +
waiting); a request that would exceed it raises `OverloadedError` (the API answers 503 with
Retry-After) instead of queueing without bound.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import tempfile
from typing import Callable

import zmq
import zmq.asyncio

from serve import ipc

log = logging.getLogger("serve.api")
_WATCH_INTERVAL_S = 0.1


class EngineDeadError(RuntimeError):
    pass


class ShuttingDownError(EngineDeadError):
    pass


class EngineRejectedError(ValueError):
    pass


class OverloadedError(RuntimeError):
    """Admitting the request would exceed the waiting-queue bound; retry later."""


class RequestGroup:
    def __init__(self, client: "EngineClient", request_ids: list[str]):
        self._client = client
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request_ids = list(request_ids)
        self.unfinished = set(request_ids)

    async def next(self) -> dict:
        """The next output of any request in the group; raises if the engine died or rejected."""
        while True:
            item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            if item["request_id"] in self.unfinished:   # drop late outputs of aborted requests
                if item["finished"]:
                    self.unfinished.discard(item["request_id"])
                return item

    def abort(self, request_id: str) -> None:
        if request_id in self.unfinished:
            self.unfinished.discard(request_id)
            self._client.send(("abort", [request_id]))

    def close(self) -> None:
        """Aborts unfinished requests (one message) and stops routing. Synchronous, so safe
        under cancellation."""
        if self.unfinished:
            self._client.send(("abort", sorted(self.unfinished)))
            self.unfinished.clear()
        self._client.unregister(self)


class EngineClient:
    def __init__(self, model: str, engine_kwargs: dict, target: str = ipc.DEFAULT_ENGINE,
                 max_waiting: int | None = None):
        self.model, self.engine_kwargs, self.target = model, engine_kwargs, target
        self.max_waiting = max_waiting   # None: no bound on queued engine requests
        self.max_pending: int | None = None   # running + waiting bound, set once ready
        self.info: dict = {}
        self.stats: dict = {}
        self.dead = False
        self.closing = False   # set when the server or the engine stops: new requests get 503
        self.on_engine_death: Callable[[], None] | None = None
        self.on_stats: Callable[[dict], None] | None = None
        # an output's engine timestamps (queue / prefill histograms), whatever its group's state
        self.on_timestamps: Callable[[dict], None] | None = None
        self._groups: dict[str, RequestGroup] = {}
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._process = None
        self._ipc_dir = None
        self._ctx = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> dict:
        """Spawns the engine process and waits until its model is loaded."""
        self._ipc_dir = tempfile.mkdtemp(prefix="serve-ipc-")
        in_addr, out_addr = f"ipc://{self._ipc_dir}/in", f"ipc://{self._ipc_dir}/out"
        self._ctx = zmq.asyncio.Context()
        self._to_engine = self._ctx.socket(zmq.PUSH)
        self._to_engine.setsockopt(zmq.LINGER, 0)
        self._to_engine.bind(in_addr)
        self._from_engine = self._ctx.socket(zmq.PULL)
        self._from_engine.setsockopt(zmq.LINGER, 0)
        self._from_engine.bind(out_addr)
        mp = multiprocessing.get_context("spawn")
        self._process = mp.Process(
            target=ipc.engine_main, name="serve-engine", daemon=True,
            args=(self.target, self.model, self.engine_kwargs, in_addr, out_addr, os.getpid()))
        self._process.start()
        log.info("engine process pid=%d loading %s", self._process.pid, self.model)
        while not await self._from_engine.poll(_WATCH_INTERVAL_S * 1000):
            if not self._process.is_alive():
                raise EngineDeadError(
                    f"engine process exited with code {self._process.exitcode} while loading")
        kind, info = ipc.decode(await self._from_engine.recv())
        if kind != "ready":
            raise EngineDeadError(f"the engine sent {kind!r} before 'ready'")
        from transformers import AutoTokenizer
        info["tokenizer"] = await asyncio.to_thread(AutoTokenizer.from_pretrained,
                                                    info["tokenizer_path"])
        self.info = info
        if self.max_waiting is not None:
            self.max_pending = max(1, int(info.get("max_num_seqs") or 0)) + self.max_waiting
        self._tasks = [asyncio.create_task(coro) for coro in
                       (self._read_loop(), self._send_loop(), self._watch_loop())]
        return self.info

    def send(self, msg: tuple) -> None:
        if not self.dead:
            self._outgoing.put_nowait(msg)

    def submit(self, requests: list[tuple[str, list[int], dict]]) -> RequestGroup:
        """Queues (request_id, prompt_token_ids, sampling_params) adds; returns their group."""
        if self.dead:
            raise EngineDeadError("the engine process is not running")
        if self.closing:
            raise ShuttingDownError("the server is shutting down")
        if self.max_pending is not None and len(self._groups) + len(requests) > self.max_pending:
            raise OverloadedError(
                f"the server is at capacity ({len(self._groups)} requests in flight, at most "
                f"{self.max_pending} running or waiting); retry later")
        group = RequestGroup(self, [r[0] for r in requests])
        for request_id, _, _ in requests:
            self._groups[request_id] = group
        self.send(("add", [[rid, list(ids), dict(params)] for rid, ids, params in requests]))
        return group

    def unregister(self, group: RequestGroup) -> None:
        for request_id in group.request_ids:
            if self._groups.get(request_id) is group:
                del self._groups[request_id]

    async def _send_loop(self) -> None:
        while True:
            await self._to_engine.send(ipc.encode(await self._outgoing.get()))

    async def _read_loop(self) -> None:
        while True:
            try:
                msg = ipc.decode(await self._from_engine.recv())
            except ipc.BadMessage as e:
                log.error("dropped a malformed message from the engine: %s", e)
                continue
            if msg[0] == "outputs":
                for out in msg[1]:
                    if self.on_timestamps and isinstance(out.get("timestamps"), dict):
                        self.on_timestamps(out["timestamps"])
                    group = self._groups.get(out["request_id"])
                    if group is not None:
                        group.queue.put_nowait(out)
                self._set_stats(msg[2])
            elif msg[0] == "stats":
                self._set_stats(msg[1])
            elif msg[0] == "stopping":
                log.warning("the engine process is stopping (SIGTERM); taking no new requests")
                self.closing = True
            elif msg[0] == "error":
                group = self._groups.get(msg[1])
                if group is not None:
                    group.queue.put_nowait(EngineRejectedError(msg[2]))

    def _set_stats(self, stats: dict) -> None:
        self.stats = stats
        if self.on_stats:
            self.on_stats(stats)

    async def _watch_loop(self) -> None:
        while self._process.is_alive():
            await asyncio.sleep(_WATCH_INTERVAL_S)
        self.dead = True
        log.error("engine process died (exit code %s); failing in-flight requests",
                  self._process.exitcode)
        self.fail_all(EngineDeadError("the engine process died"))
        if self.on_engine_death:
            self.on_engine_death()

    def fail_all(self, error: Exception) -> None:
        """Ends every open request with `error` (engine death, server shutdown)."""
        for group in set(self._groups.values()):
            group.queue.put_nowait(error)

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Asks the engine to exit, kills it if it does not; reaps it."""
        for task in self._tasks:
            task.cancel()
        proc = self._process
        if proc is not None:
            if proc.is_alive() and not self.info:
                proc.terminate()   # still loading: it reads no messages, but exits on SIGTERM
            elif proc.is_alive():
                try:
                    await asyncio.wait_for(self._to_engine.send(ipc.encode(("shutdown",))), 1.0)
                except (asyncio.TimeoutError, zmq.ZMQError):
                    pass
            await asyncio.to_thread(proc.join, timeout_s)
            if proc.is_alive():
                log.warning("engine process did not exit in %.0f s; killing it", timeout_s)
                proc.kill()
                await asyncio.to_thread(proc.join, 5.0)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        if self._ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
