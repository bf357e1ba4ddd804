"""API <-> engine messages: msgpack of plain types checked against ipc.MESSAGES (no pickle), one
add / abort message per API request, and every waiting message handled before the next step."""
from __future__ import annotations

import asyncio
import os
import pickle

import pytest
import zmq

from serve import ipc
from serve.api.engine_client import EngineClient, OverloadedError
from serve.sampling_params import RequestOutput, SamplingParams

PARAMS = dict(max_tokens=4, temperature=0.7, top_p=0.9, top_k=-1, min_p=0.0, seed=2**63 - 1,
              stop_token_ids=[7, 8], ignore_eos=False, logprobs=2)
OUT = ipc.output_to_dict(RequestOutput("r-1", [5], [-0.5], [[(5, -0.5), (6, -1.25)]], True,
                                       "stop", 3, 1))
STATS = dict(running=1, waiting=0, kv_pages_total=10, kv_pages_used=2, kv_usage=0.2)
MESSAGES = [
    ("add", [["r-1", [1, 2, 3], PARAMS], ["r-2", [4], PARAMS]]),
    ("abort", ["r-1", "r-2"]),
    ("shutdown",),
    ("ready", {"tokenizer_path": "/tmp/x", "model_name": "m", "max_model_len": 4096,
               "max_num_seqs": 8, "pid": 12}),
    ("outputs", [OUT], STATS),
    ("stats", STATS),
    ("error", "r-1", "prompt_token_ids: empty prompt"),
    ("stopping",),
]


def _lists(x):
    if isinstance(x, (list, tuple)):
        return [_lists(v) for v in x]
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    return x


@pytest.mark.parametrize("msg", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_every_message_kind_round_trips(msg):
    assert set(ipc.MESSAGES) == {m[0] for m in MESSAGES}
    got = ipc.decode(ipc.encode(msg))
    assert _lists(got) == _lists(msg)
    if msg[0] == "add":   # what the engine builds its SamplingParams from
        assert SamplingParams(**got[1][0][2]).stop_token_ids == (7, 8)
    if msg[0] == "outputs":
        assert got[1][0]["top_logprobs"] == [[[5, -0.5], [6, -1.25]]]


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("payload", [
    pickle.dumps(("add", "r", [1], {})),                 # what the old protocol sent
    pickle.dumps(_Evil()),                               # a pickle that runs code on load
    b"", b"\xc1", b"\x93\x01\x02",                       # not msgpack / not a message array
    ipc.msgpack.packb(["add", "r", [1], {}]),            # the old add layout
    ipc.msgpack.packb(["exec", "import os"]),            # unknown kind
    ipc.msgpack.packb(["abort", "r-1"]),                 # a field of the wrong type
    ipc.msgpack.packb(["stats", {"x": ipc.msgpack.ExtType(1, b"")}]),   # not plain data
])
def test_anything_else_is_rejected(payload, capsys):
    with pytest.raises(ipc.BadMessage):
        ipc.decode(payload)
    assert "pwned" not in capsys.readouterr().out


def test_encode_refuses_objects():
    with pytest.raises(ipc.BadMessage):
        ipc.encode(("stats", {"tokenizer": object()}))


class _RecordingEngine:
    def __init__(self):
        self.calls, self.live = [], set()

    def add_request(self, rid, ids, params):
        self.calls.append(("add", rid))
        self.live.add(rid)

    def abort(self, rid):
        self.calls.append(("abort", rid))
        self.live.discard(rid)

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        self.calls.append(("step", len(self.live)))
        return []

    def stats(self):
        return dict(STATS)


def test_engine_loop_handles_all_waiting_messages_before_a_step_and_drops_pickles():
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    out_pull, out_push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        pull.bind("inproc://in")
        push.connect("inproc://in")
        out_pull.bind("inproc://out")
        out_push.connect("inproc://out")
        ids = [f"r-{i}" for i in range(500)]
        push.send(pickle.dumps(("shutdown",)))          # dropped, not obeyed
        ipc.send_msg(push, ("add", [[r, [1, 2], PARAMS] for r in ids]))
        ipc.send_msg(push, ("abort", ids))
        ipc.send_msg(push, ("shutdown",))
        engine = _RecordingEngine()
        ipc._loop(engine, SamplingParams, pull, out_push, os.getppid(), [])
        assert [c for c in engine.calls if c[0] == "step"] == []   # all aborted before a step
        assert engine.calls == [("add", r) for r in ids] + [("abort", r) for r in ids]
        with pytest.raises(zmq.Again):                 # no step ran, so no outputs
            out_pull.recv(zmq.NOBLOCK)
    finally:
        for s in (push, pull, out_pull, out_push):
            s.close(linger=0)
        ctx.term()


def test_one_message_per_api_request_and_admission_bound():
    async def run():
        client = EngineClient("fake", {}, max_waiting=2)
        client.max_pending = 8 + 2
        reqs = [(f"a-{i}", [1, 2], PARAMS) for i in range(6)]
        group = client.submit(reqs)
        assert client._outgoing.qsize() == 1
        kind, batch = client._outgoing.get_nowait()
        assert kind == "add" and [r[0] for r in batch] == [r[0] for r in reqs]
        with pytest.raises(OverloadedError, match="at capacity"):
            client.submit([(f"b-{i}", [1], PARAMS) for i in range(5)])
        assert client._outgoing.qsize() == 0            # the refused request sent nothing
        group.close()
        assert client._outgoing.get_nowait() == ("abort", sorted(r[0] for r in reqs))
        assert client._outgoing.qsize() == 0 and not client._groups
        client.submit([(f"b-{i}", [1], PARAMS) for i in range(10)])   # room again
    asyncio.run(run())
