"""The server under abuse and its security defaults (issue 17 §2-3), against `python -m serve`
with the fake engine on loopback. Every case is bounded: socket timeouts, bounded loops, and the
API process's memory is read from /proc after the large-body cases."""
from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from tests.serve.fake_engine import FAKE, ServerProcess

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("fake:slow", *FAKE, "--api-key", KEY, "--max-request-bytes", str(1 << 20),
                      "--body-timeout", "1", "--header-timeout", "1",
                      "--max-choices-per-request", "64", "--max-waiting", "2",
                      "--allowed-origins", "http://ok.example", "--shutdown-grace", "0.5")
    yield s
    s.stop()


def _addr(server):
    u = urlparse(server.url)
    return u.hostname, u.port


def _request(server, method, path, body=None, headers=None, timeout=10.0):
    host, port = _addr(server)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={**AUTH, **(headers or {})})
    r = conn.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    conn.close()
    return out


def _error(raw: bytes) -> dict:
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}   # the OpenAI error body
    return err


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


COMPLETION = {"prompt": "hi", "max_tokens": 2}


# ---- §3 security defaults -----------------------------------------------------------------
def test_metrics_needs_the_api_key(server):
    status, _, raw = _request(server, "GET", "/metrics", headers={"Authorization": ""})
    assert status == 401 and _error(raw)["code"] == "invalid_api_key"
    status, _, raw = _request(server, "GET", "/metrics")
    assert status == 200 and b"# TYPE" in raw
    assert _request(server, "GET", "/health", headers={"Authorization": ""})[0] == 200


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None,
                                   "multipart/form-data; boundary=x"])
def test_post_bodies_must_be_json(server, ctype):
    headers = {"Content-Type": ctype} if ctype else {"Content-Type": ""}
    status, _, raw = _request(server, "POST", "/v1/completions", COMPLETION, headers=headers)
    assert status == 415 and _error(raw)["code"] == "unsupported_media_type"
    ok = _request(server, "POST", "/v1/completions", COMPLETION,
                  headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok[0] == 200


def test_host_allow_list_stops_dns_rebinding(server):
    _, port = _addr(server)
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.2"):
        status, _, raw = _request(server, "GET", "/health", headers={"Host": host})
        assert status == 421 and _error(raw)["code"] == "invalid_host", host
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert _request(server, "GET", "/health", headers={"Host": host})[0] == 200, host


def test_cors_only_for_allowed_origins(server):
    pre = {"Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = _request(server, "OPTIONS", "/v1/completions", headers=pre)
    assert status == 200 and headers.get("access-control-allow-origin") == "http://ok.example"
    status, headers, _ = _request(server, "OPTIONS", "/v1/completions",
                                  headers={**pre, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in {k.lower() for k in headers}


# ---- §2 bounded under abuse ---------------------------------------------------------------
def test_body_limit_413_without_reading_it(server):
    t0 = time.monotonic()
    host, port = _addr(server)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}"
                  f"\r\nContent-Type: application/json\r\nContent-Length: {50 << 20}\r\n\r\n"
                  '{"prompt": "'.encode())
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 3


def test_chunked_body_over_the_limit_is_413(server):
    rss0 = _rss_mb(server.proc.pid)

    def chunks():
        yield b'{"prompt": "'
        for _ in range(40):            # 2.5 MiB > the 1 MiB limit
            yield b"a" * (64 << 10)
        yield b'"}'
    host, port = _addr(server)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=chunks(), headers=AUTH, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 413 and _error(r.read())["code"] == "request_too_large"
    except (BrokenPipeError, ConnectionResetError):
        pass   # the server answered and closed while we were still sending: also bounded
    finally:
        conn.close()
    assert _rss_mb(server.proc.pid) - rss0 < 200


def test_prompt_longer_than_the_context_is_refused_before_tokenizing(server):
    # 900 KB of text (under the body limit) for a 512-token fake model: refused from its length
    t0 = time.monotonic()
    status, _, raw = _request(server, "POST", "/v1/completions",
                              {"prompt": "x" * 900_000, "max_tokens": 1})
    assert status == 400 and _error(raw)["code"] == "context_length_exceeded"
    assert time.monotonic() - t0 < 2
    status, _, raw = _request(server, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "y" * 300_000}] * 3, "max_tokens": 1})
    assert status == 400 and _error(raw)["param"] == "messages"


def test_prompts_times_n_is_capped(server):
    status, _, raw = _request(server, "POST", "/v1/completions",
                              {"prompt": ["a"] * 100, "n": 4, "max_tokens": 1})
    err = _error(raw)
    assert status == 400 and err["param"] == "n" and "400 completions" in err["message"]


def test_deep_json_and_bad_numbers_are_400(server):
    for body in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
                 b'{"prompt": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001):
        status, _, raw = _request(server, "POST", "/v1/completions", body)
        assert status == 400, raw[:200]
        _error(raw)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "ok \ud800 not ok", "max_tokens": 1}, "prompt"),
    ({"prompt": ["fine", "bad \udfff"], "max_tokens": 1}, "prompt[1]"),
    ({"messages": [{"role": "user", "content": "\udc00"}]}, "messages[0].content"),
    ({"prompt": "hi", "stop": ["\ud83d"]}, "stop[0]"),
])
def test_lone_surrogates_are_400(server, body, param):
    raw_body = json.dumps(body).encode()       # json escapes them as \udXXX
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, _, raw = _request(server, "POST", path, raw_body)
    err = _error(raw)
    assert status == 400 and err["param"] == param and "surrogate" in err["message"]
    # a valid surrogate pair (an emoji) is text and passes
    ok = {"prompt": "emoji \U0001f642", "max_tokens": 1}
    assert _request(server, "POST", "/v1/completions", ok)[0] == 200


def test_header_and_body_read_timeouts(server):
    host, port = _addr(server)
    t0 = time.monotonic()
    socks = []
    try:
        for _ in range(20):   # half-sent headers
            s = socket.create_connection((host, port), timeout=6)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
            socks.append(s)
        half = socket.create_connection((host, port), timeout=6)   # half-sent body
        half.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
                     f"{KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     '{"prompt"'.encode())
        socks.append(half)
        assert half.recv(65536).startswith(b"HTTP/1.1 408")
        for s in socks[:-1]:
            assert s.recv(1) == b""             # closed by the server
    finally:
        for s in socks:
            s.close()
    assert time.monotonic() - t0 < 5


def _stream_open(server, body):
    host, port = _addr(server)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}).encode(),
                 headers=AUTH)
    r = conn.getresponse()
    assert r.status == 200
    r.readline()   # the first event: the engine has the requests
    return conn, r


def test_admission_control_503_with_retry_after(server):
    # fake engine: 8 running, --max-waiting 2 -> 10 engine requests in flight at most
    conn, _ = _stream_open(server, {"prompt": "hold", "n": 10, "max_tokens": 400})
    try:
        status, headers, raw = _request(server, "POST", "/v1/completions", COMPLETION)
        assert status == 503 and headers.get("retry-after") == "1"
        assert _error(raw)["code"] == "server_overloaded"
    finally:
        conn.close()   # client gone: its 10 requests are aborted in one message
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if _request(server, "POST", "/v1/completions", COMPLETION)[0] == 200:
            break
        time.sleep(0.1)
    else:
        pytest.fail("capacity did not come back after the client left")


def test_dropped_fan_out_stops_costing_the_engine(server):
    # 8 requests of 400 tokens at 50 ms steps would keep the fake engine busy 20 s; dropped
    # after one event, a new request must get its first token at once
    conn, _ = _stream_open(server, {"prompt": ["p"] * 8, "n": 1, "max_tokens": 400})
    conn.close()
    t0 = time.monotonic()
    deadline = t0 + 5
    while time.monotonic() < deadline:
        status, _, _ = _request(server, "POST", "/v1/completions", COMPLETION)
        if status == 200:
            break
        time.sleep(0.05)
    assert status == 200 and time.monotonic() - t0 < 3


def test_shutdown_grace_is_configurable(server):
    """Last in the module: stops the server. --shutdown-grace 0.5 ends a long stream with an
    SSE error well before the 3 s default would."""
    conn, r = _stream_open(server, {"prompt": "long", "max_tokens": 400})
    got = []
    reader = threading.Thread(target=lambda: got.append(r.read()), daemon=True)
    reader.start()
    t0 = time.monotonic()
    server.signal(signal.SIGTERM)
    reader.join(8)
    assert got and b"shutting down" in got[0] and time.monotonic() - t0 < 2.5
    conn.close()
    assert server.wait(15) == 0


# ---- engine stops taking work -> /health 503 at once ---------------------------------------
def test_health_turns_503_when_the_engine_gets_sigterm():
    import os

    s = ServerProcess("fake", *FAKE, "--host", "0.0.0.0")
    try:
        assert "not loopback) without --api-key" in s.logs()
        port = urlparse(s.url).port
        s.url = f"http://127.0.0.1:{port}"
        assert _request(s, "GET", "/health")[0] == 200
        os.kill(s.engine_pid, signal.SIGTERM)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            status, _, raw = _request(s, "GET", "/health")
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503 and time.monotonic() - t0 < 1.0
        assert _error(raw)["code"] in ("shutting_down", "engine_dead")
        status, _, raw = _request(s, "POST", "/v1/completions", COMPLETION)
        assert status == 503
    finally:
        s.stop()


def test_tokenizing_a_huge_prompt_does_not_block_the_event_loop():
    """A 1 MB prompt within a (fake) 400k-token context is tokenized in the worker pool: it
    takes seconds on the byte-level tokenizer while /health keeps answering in milliseconds."""
    s = ServerProcess("fake", *FAKE, "--max-model-len", "400000")
    try:
        result = {}

        def big():
            result["status"] = _request(s, "POST", "/v1/completions",
                                        {"prompt": "ab " * 330_000, "max_tokens": 1},
                                        timeout=60)[0]
        t = threading.Thread(target=big, daemon=True)
        t.start()
        worst, probes, t0 = 0.0, 0, time.monotonic()
        while t.is_alive() and time.monotonic() - t0 < 30:
            p0 = time.monotonic()
            assert _request(s, "GET", "/health")[0] == 200
            worst, probes = max(worst, time.monotonic() - p0), probes + 1
            time.sleep(0.02)
        t.join(1)
        assert result.get("status") == 400        # 990,000 tokens > 400,000: after tokenizing
        assert probes >= 5 and worst < 0.5, (probes, worst)
    finally:
        s.stop()


def test_small_kv_pool_is_advertised_as_the_context(tmp_path_factory):
    """A pool of 4 x 16 tokens: /v1/models says 64 (not 4096) and the start-up log says why; a
    request that cannot fit is a 400, not a completion cut with finish_reason "length"."""
    from tests.serve.fake_engine import tiny_model

    s = ServerProcess(tiny_model(tmp_path_factory), "--device", "cpu", "--page-size", "16",
                      "--num-kv-pages", "4")
    try:
        status, _, raw = _request(s, "GET", "/v1/models")
        assert status == 200 and json.loads(raw)["data"][0]["max_model_len"] == 64
        assert "max_model_len lowered from 4096 to 64" in s.logs()
        status, _, raw = _request(s, "POST", "/v1/completions",
                                  {"prompt": [5] * 40, "max_tokens": 30})
        assert status == 400 and _error(raw)["code"] == "context_length_exceeded"
        status, _, raw = _request(s, "POST", "/v1/completions",
                                  {"prompt": [5] * 40, "max_tokens": 24, "ignore_eos": True})
        body = json.loads(raw)
        assert status == 200 and body["usage"]["completion_tokens"] == 24
    finally:
        s.stop()
