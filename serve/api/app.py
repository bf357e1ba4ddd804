"""The Starlette application: routes, Bearer auth, OpenAI-style error bodies."""
from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from serve.api import routes
from serve.api.engine_client import EngineClient
from serve.api.protocol import ApiError
from serve.metrics import ServerMetrics

log = logging.getLogger("serve.api")


@dataclass
class ServerState:
    client: EngineClient
    tokenizer: object
    model_name: str
    max_model_len: int
    model_names: set[str] = field(default_factory=set)   # names a request's "model" may use
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    created: int = field(default_factory=lambda: int(time.time()))


def _error(status: int, message: str, type_: str, code=None, param=None) -> JSONResponse:
    return JSONResponse(ApiError(status, message, param, type_, code).body(), status_code=status)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _error(exc.status_code, str(exc.detail), type_)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return _error(500, f"internal server error: {type(exc).__name__}", "internal_server_error")


async def health(request: Request):
    state: ServerState = request.app.state.server
    if state.client.dead:
        return _error(503, "the engine process is not running", "service_unavailable", "engine_dead")
    return JSONResponse({"status": "ok"})


async def models(request: Request):
    state: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created,
        "owned_by": "tskernels", "max_model_len": state.max_model_len}]})


async def metrics(request: Request):
    state: ServerState = request.app.state.server
    state.metrics.engine_stats = state.client.stats
    state.metrics.engine_alive = not state.client.dead
    return PlainTextResponse(state.metrics.render(),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


class BearerAuth:
    """Requires `Authorization: Bearer <api_key>` on /v1/*; /health and /metrics stay open."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            headers = dict(scope["headers"])
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key):
                response = _error(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                                  "authentication_error", "invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(state: ServerState, api_key: str | None = None):
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                            Exception: _internal_error},
    )
    app.state.server = state
    return BearerAuth(app, api_key) if api_key else app
