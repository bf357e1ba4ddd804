"""The engine process: runs the Engine loop and talks to the API process over ZMQ.

Two PUSH/PULL pipes, both bound by the API process (ipc:// sockets in a private temp dir):
  API -> engine  ("add", [[request_id, prompt_token_ids, sampling_params_dict], ...])
                          one message per API request (its n x prompts engine requests)
                 ("abort", [request_id, ...])
                 ("shutdown",)
  engine -> API  ("ready", info)             once, after the model is loaded
                 ("outputs", [output_dict], stats)   OUTPUT_FIELDS; "timestamps" once per
                                            request (/metrics' queue and prefill times)
                 ("stats", stats)           after aborts/adds that changed nothing else
                 ("error", request_id, message)   the engine rejected an add (ValueError)
                 ("stopping",)              got SIGTERM: takes no new work from now on
Messages are msgpack arrays of plain types (None, bool, int, float, str, lists, maps), checked
against MESSAGES on receipt (`decode` raises `BadMessage`): unlike pickle, a process that can
reach the sockets can send wrong data but cannot run code, and the API process never imports
the engine (or torch) to read them. The tokenizer reaches the API process as files: the engine
saves it into the private socket directory and sends the path.

Per engine loop iteration every message waiting is handled (adds and aborts) before the next
step runs, so an abort never waits behind a step it could have cancelled.

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

import msgpack
import zmq

DEFAULT_ENGINE = "serve.engine:Engine"
OUTPUT_FIELDS = ("request_id", "new_token_ids", "logprobs", "top_logprobs", "finished",
                 "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "error",
                 "timestamps")
_IDLE_POLL_MS = 100
SIGTERM_GRACE_S = 5.0

log = logging.getLogger("serve.engine_process")
# the one log format of both processes (the logger name tells them apart: serve.engine* here)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class BadMessage(ValueError):
    """A received message that is not one of MESSAGES (wrong encoding, kind, arity or types)."""


_PLAIN_SCALARS = (type(None), bool, int, float, str)
# kind -> the type of each field after the kind (list / dict: contents are plain types)
MESSAGES: dict[str, tuple] = {
    "add": (list,), "abort": (list,), "shutdown": (),
    "ready": (dict,), "outputs": (list, dict), "stats": (dict,), "error": (str, str),
    "stopping": (),   # engine -> API: SIGTERM; it takes no new work (/health turns 503)
}
_MAX_DEPTH = 8


def _plain(x, depth: int = 0) -> bool:
    if isinstance(x, _PLAIN_SCALARS):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(x, (list, tuple)):
        return all(_plain(v, depth + 1) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, (str, int)) and not isinstance(k, bool) and _plain(v, depth + 1)
                   for k, v in x.items())
    return False


def encode(msg: tuple) -> bytes:
    """A message as msgpack bytes; raises BadMessage for anything but MESSAGES of plain types."""
    _check(msg)
    return msgpack.packb(list(msg), use_bin_type=True)


def decode(data: bytes) -> tuple:
    """The message `data` encodes, checked against MESSAGES; raises BadMessage otherwise
    (pickles included: they are not msgpack, or not a known message)."""
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:   # msgpack raises several unrelated types for malformed input
        raise BadMessage(f"not a msgpack message ({type(e).__name__})") from None
    if not isinstance(msg, list):
        raise BadMessage(f"expected a message array, got {type(msg).__name__}")
    _check(msg)
    return tuple(msg)


def _check(msg) -> None:
    if not msg or not isinstance(msg[0], str) or msg[0] not in MESSAGES:
        raise BadMessage(f"unknown message kind {msg[0] if msg else None!r:.40}")
    kinds = MESSAGES[msg[0]]
    if len(msg) != 1 + len(kinds):
        raise BadMessage(f"{msg[0]!r}: expected {len(kinds)} fields, got {len(msg) - 1}")
    for i, (v, t) in enumerate(zip(msg[1:], kinds)):
        if not isinstance(v, t) and not (t is list and isinstance(v, tuple)):
            raise BadMessage(f"{msg[0]!r} field {i}: expected {t.__name__}, got {type(v).__name__}")
        if not _plain(v):
            raise BadMessage(f"{msg[0]!r} field {i}: not plain data")


def send_msg(sock, msg: tuple, flags: int = 0):
    return sock.send(encode(msg), flags, copy=False)


def recv_msg(sock, flags: int = 0) -> tuple:
    return decode(sock.recv(flags, copy=True))


def save_tokenizer(tokenizer, in_addr: str) -> str:
    """Saves the engine's tokenizer next to the private sockets (a fresh temp dir for non-ipc
    addresses); returns the directory the API process loads it from."""
    import tempfile

    base = os.path.dirname(in_addr[len("ipc://"):]) if in_addr.startswith("ipc://") else None
    path = tempfile.mkdtemp(prefix="tokenizer-", dir=base)
    tokenizer.save_pretrained(path)
    return path


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
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
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
            "tokenizer_path": save_tokenizer(engine.tokenizer, in_addr),
            "model_name": engine.model_name,
            "max_model_len": int(engine.max_model_len),
            "max_num_seqs": int(getattr(getattr(engine, "args", None), "max_num_seqs", 0)
                                or getattr(engine, "max_num_seqs", 0) or 0),
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
            return send_msg(outbox, msg)
        except zmq.Again:
            if os.getppid() != parent_pid:
                raise _ApiGone from None


def _loop(engine, params_cls, inbox, outbox, parent_pid: int, sigterm_at: list[float]) -> None:
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)

    def send(msg: tuple) -> None:
        _send(outbox, msg, parent_pid)

    announced = False
    while True:
        if os.getppid() != parent_pid:
            raise _ApiGone
        if sigterm_at and not announced:
            send(("stopping",))
            announced = True
        if sigterm_at and time.monotonic() - sigterm_at[0] > SIGTERM_GRACE_S:
            log.warning("SIGTERM and no shutdown from the API process; exiting")
            return
        changed = False
        if poller.poll(0 if engine.has_unfinished() else _IDLE_POLL_MS):
            while True:
                try:
                    msg = recv_msg(inbox, zmq.NOBLOCK)
                except zmq.Again:
                    break
                except BadMessage as e:
                    log.error("dropped a malformed message from the API process: %s", e)
                    continue
                if msg[0] == "shutdown":
                    log.info("shutdown requested")
                    return
                changed |= _handle(engine, params_cls, msg, send, stopping=bool(sigterm_at))
        if engine.has_unfinished():
            outputs = engine.step()
            send(("outputs", [output_to_dict(o) for o in outputs], engine.stats()))
        elif changed:
            send(("stats", engine.stats()))


def _handle(engine, params_cls, msg: tuple, send, stopping: bool = False) -> bool:
    kind = msg[0]
    if kind == "add":
        for req in msg[1]:
            if not (isinstance(req, list) and len(req) == 3 and isinstance(req[0], str)
                    and isinstance(req[1], list) and isinstance(req[2], dict)):
                log.error("dropped a malformed add entry")
                continue
            request_id, prompt_token_ids, params = req
            if stopping:
                send(("error", request_id, "the engine is shutting down"))
                continue
            try:
                engine.add_request(request_id, prompt_token_ids, params_cls(**params))
            except (ValueError, TypeError) as e:
                send(("error", request_id, str(e)))
        return True
    if kind == "abort":
        for request_id in msg[1]:
            try:
                engine.abort(request_id)
            except KeyError:
                pass   # finished before the abort arrived
        return True
    log.error("unknown message %r", kind)
    return False
