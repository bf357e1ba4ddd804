"""HTTP-level defences in front of the routes: Host allow-list, Bearer auth, JSON content type,
request-body size and read-time limits, and a header read timeout for the h11 protocol.

Each rejection is an OpenAI-style error body. Order (outermost first): Host (421), auth (401),
content type (415), body size (413, from Content-Length before any byte is read; the routes'
`read_body` enforces it again while reading, with the read timeout, 408).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from dataclasses import dataclass, field

from starlette.requests import Request

from serve.api.protocol import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass
class HttpLimits:
    """What one HTTP request may cost the API process before it reaches the engine."""

    max_body_bytes: int = 16 << 20        # 413 beyond
    body_timeout_s: float = 30.0          # the whole body must arrive within this (408)
    header_timeout_s: float = 10.0        # request line + headers must arrive within this
    max_choices: int = 256                # prompts x n engine requests per API request (400)
    api_key: str | None = None            # Bearer token for /v1/* and /metrics
    allowed_hosts: list[str] = field(default_factory=lambda: list(LOOPBACK_NAMES))  # "*": any


def default_allowed_hosts(bind_host: str) -> list[str]:
    """The bound address and the loopback names; '*' (any) for a wildcard bind, where the
    names clients use cannot be known (set --allowed-hosts there)."""
    try:
        if ipaddress.ip_address(bind_host).is_unspecified:
            return ["*"]
    except ValueError:
        pass
    return sorted({bind_host.lower(), *LOOPBACK_NAMES})


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(value: bytes) -> str:
    """Host header -> the name without port ('[::1]:8000' -> '::1')."""
    h = value.decode("latin-1").strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


async def _reject(send, status: int, message: str, type_: str, code: str | None = None,
                  headers: list | None = None) -> None:
    body = json.dumps(ApiError(status, message, None, type_, code).body()).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class HttpGuard:
    """ASGI middleware applying `HttpLimits` to every HTTP request."""

    def __init__(self, app, limits: HttpLimits):
        self.app, self.limits = app, limits
        self._hosts = None if "*" in limits.allowed_hosts else \
            {h.lower().strip("[]") for h in limits.allowed_hosts}
        self._key = limits.api_key.encode() if limits.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        path, method = scope["path"], scope["method"]
        if self._hosts is not None and _host_name(headers.get(b"host", b"")) not in self._hosts:
            # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil...
            return await _reject(send, 421, "the Host header is not one this server answers to "
                                 "(see --allowed-hosts)", "invalid_request_error", "invalid_host")
        if self._key is not None and (path.startswith("/v1") or path == "/metrics") \
                and method != "OPTIONS":
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
                return await _reject(send, 401, "invalid or missing API key (send "
                                     "'Authorization: Bearer <key>')", "authentication_error",
                                     "invalid_api_key")
        if method == "POST":
            ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if ctype != b"application/json":
                # a cross-site "simple" request (text/plain, form) never reaches JSON parsing
                return await _reject(send, 415, "the request body must be JSON sent with "
                                     "'Content-Type: application/json'", "invalid_request_error",
                                     "unsupported_media_type")
            length = headers.get(b"content-length")
            if length is not None:
                try:
                    n = int(length)
                except ValueError:
                    return await _reject(send, 400, "invalid Content-Length",
                                         "invalid_request_error")
                if n > self.limits.max_body_bytes:
                    return await _reject(send, 413, f"the request body has {n} bytes; the limit "
                                         f"is {self.limits.max_body_bytes}",
                                         "invalid_request_error", "request_too_large",
                                         headers=[(b"connection", b"close")])
            return await self.app(scope, *self._bounded(receive, send))
        return await self.app(scope, receive, send)

    def _bounded(self, receive, send):
        """receive / send for a route that reads the body itself (request.body()): past the
        limit the client gets a 413 and the route sees a disconnect; its own response, if any,
        is dropped. So no route can buffer more than max_body_bytes (chunked bodies too)."""
        limit, state = self.limits.max_body_bytes, {"size": 0, "rejected": False,
                                                    "started": False}

        async def guarded_receive():
            msg = await receive()
            if msg["type"] == "http.request" and not state["rejected"]:
                state["size"] += len(msg.get("body", b""))
                if state["size"] > limit:
                    state["rejected"] = True
                    if not state["started"]:
                        await _reject(send, 413, f"the request body exceeds {limit} bytes",
                                      "invalid_request_error", "request_too_large",
                                      headers=[(b"connection", b"close")])
            return {"type": "http.disconnect"} if state["rejected"] else msg

        async def guarded_send(msg):
            if state["rejected"]:
                return
            state["started"] = True
            await send(msg)

        return guarded_receive, guarded_send


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The request body, at most `max_body_bytes` (413) and within `body_timeout_s` (408)."""
    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise ApiError(413, f"the request body exceeds {limits.max_body_bytes} bytes",
                               code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)
    try:
        return await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.body_timeout_s} s",
                       code="request_timeout") from None


def parse_json(raw: bytes):
    """json.loads with client faults as 400s: invalid JSON or UTF-8, nesting too deep for the
    parser (RecursionError), numbers Python refuses (ValueError), and strings holding lone
    UTF-16 surrogates (valid JSON escapes, but not text any tokenizer can take)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if b"\\ud" in raw or b"\\uD" in raw:   # surrogates only arrive as \u escapes
        _check_text(body)
    return body


def _check_text(body) -> None:
    stack = [(body, None)]
    while stack:
        v, param = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, f"'{param}' contains a lone UTF-16 surrogate (not valid "
                               "Unicode text)", param=param) from None
        elif isinstance(v, dict):
            stack.extend((x, k if param is None else f"{param}.{k}") for k, x in v.items())
            stack.extend((k, param) for k in v if isinstance(k, str))
        elif isinstance(v, list):
            stack.extend((x, f"{param}[{i}]") for i, x in enumerate(v))


def header_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol closing connections whose request line + headers do not arrive
    within `timeout_s` (uvicorn has a keep-alive timeout, none while headers trickle in)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._seen = 0
            self._arm()

        def _arm(self):
            self._timer = self.loop.call_later(timeout_s, self._expire, self._seen)

        def _expire(self, seen_at_arm: int):
            waiting_for_headers = self.cycle is None or self.cycle.response_complete
            if waiting_for_headers and self._seen == seen_at_arm:
                self.transport.close()
            elif not self.transport.is_closing():
                self._arm()

        def handle_events(self):
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:
                self._seen += 1

        def connection_lost(self, exc):
            self._timer.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutH11
