"""The engine process: runs the Engine loop and talks to the API process over ZMQ.

Two PUSH/PULL pipes, both bound by the API process (ipc:// sockets in a private temp dir):
  API -> engine  ("add", request_id, prompt_token_ids, sampling_params_dict)
                 ("abort", request_id)
                 ("shutdown",)
  engine -> API  ("ready", info)             once, after the model is loaded
                 ("outputs", [output_dict], stats)
                 ("stats", stats)           after aborts/adds that changed nothing else
                 ("error", request_id, message)   the engine rejected an add (ValueError)
Messages are pickled Python tuples of plain types, so the API process never imports the
engine (or torch) to read them.

Signals: Ctrl-C and `kill -TERM -<pgid>` reach both processes, and the API process owns the
shutdown sequence (drain HTTP, then send "shutdown"). So the engine ignores SIGINT, and once
serving it defers SIGTERM for SIGTERM_GRACE_S, exiting earlier on "shutdown" or if the API
process disappears. While loading, SIGTERM exits at once.
"""
from __future__ import annotations

import importlib
import logging
import os
import shutil
import signal
import sys
import time
import traceback

import zmq

DEFAULT_ENGINE = "serve.engine:Engine"
OUTPUT_FIELDS = ("request_id", "new_token_ids", "logprobs", "top_logprobs", "finished",
                 "finish_reason", "prompt_tokens", "completion_tokens")
_IDLE_POLL_MS = 100
SIGTERM_GRACE_S = 5.0

log = logging.getLogger("serve.engine_process")


def load_engine_target(target: str):
    """'pkg.module:Class' -> (Engine class, SamplingParams class of the same module)."""
    module_name, _, cls_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name or "Engine"), getattr(module, "SamplingParams")


def output_to_dict(out) -> dict:
    d = {name: getattr(out, name, None) for name in OUTPUT_FIELDS}
    d["new_token_ids"] = [int(t) for t in d["new_token_ids"]]
    return d


def engine_main(target: str, model: str, engine_kwargs: dict, in_addr: str, out_addr: str,
                parent_pid: int) -> None:
    """Entry point of the engine process (multiprocessing 'spawn' target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sigterm_at: list[float] = []
    # loading: exit now — the default action, so that a long C call (reading the weights)
    # cannot defer it the way it defers a Python-level handler
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine %(levelname)s %(message)s")
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 2000)
    outbox.setsockopt(zmq.SNDTIMEO, 1000)
    outbox.connect(out_addr)
    try:
        engine_cls, params_cls = load_engine_target(target)
        engine = engine_cls(model, **engine_kwargs)
        _send(outbox, ("ready", {
            "tokenizer": engine.tokenizer,
            "model_name": engine.model_name,
            "max_model_len": int(engine.max_model_len),
            "pid": os.getpid(),
        }), parent_pid)
        _send(outbox, ("stats", engine.stats()), parent_pid)   # /metrics has gauges from the start
        signal.signal(signal.SIGTERM, lambda *_: sigterm_at.append(time.monotonic()))
        _loop(engine, params_cls, inbox, outbox, parent_pid, sigterm_at)
    except _ApiGone:
        log.warning("the API process is gone; exiting")
        if in_addr.startswith("ipc://"):   # it could not remove its socket dir itself
            shutil.rmtree(os.path.dirname(in_addr[len("ipc://"):]), ignore_errors=True)
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)   # skip atexit/zmq teardown: the API process treats any exit as death
    finally:
        inbox.close(linger=0)
        outbox.close()
        ctx.term()


class _ApiGone(Exception):
    pass


def _send(outbox, msg: tuple, parent_pid: int) -> None:
    # A PUSH socket whose peer is gone blocks forever: send with a timeout (SNDTIMEO) and
    # look for the parent between tries.
    while True:
        try:
            return outbox.send_pyobj(msg)
        except zmq.Again:
            if os.getppid() != parent_pid:
                raise _ApiGone from None


def _loop(engine, params_cls, inbox, outbox, parent_pid: int, sigterm_at: list[float]) -> None:
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)

    def send(msg: tuple) -> None:
        _send(outbox, msg, parent_pid)

    while True:
        if os.getppid() != parent_pid:
            raise _ApiGone
        if sigterm_at and time.monotonic() - sigterm_at[0] > SIGTERM_GRACE_S:
            log.warning("SIGTERM and no shutdown from the API process; exiting")
            return
        changed = False
        if poller.poll(0 if engine.has_unfinished() else _IDLE_POLL_MS):
            while True:
                try:
                    msg = inbox.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if msg[0] == "shutdown":
                    log.info("shutdown requested")
                    return
                changed |= _handle(engine, params_cls, msg, send)
        if engine.has_unfinished():
            outputs = engine.step()
            send(("outputs", [output_to_dict(o) for o in outputs], engine.stats()))
        elif changed:
            send(("stats", engine.stats()))


def _handle(engine, params_cls, msg: tuple, send) -> bool:
    kind = msg[0]
    if kind == "add":
        _, request_id, prompt_token_ids, params = msg
        try:
            engine.add_request(request_id, prompt_token_ids, params_cls(**params))
        except (ValueError, TypeError) as e:
            send(("error", request_id, str(e)))
        return True
    if kind == "abort":
        try:
            engine.abort(msg[1])
        except KeyError:
            pass   # finished before the abort arrived
        return True
    log.error("unknown message %r", kind)
    return False
