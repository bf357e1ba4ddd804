"""The Starlette application: routes, the HTTP guards (Host allow-list, Bearer auth on /v1/* and
/metrics, JSON content type, body limits: serve.api.guards), optional CORS, OpenAI-style error
bodies."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from serve.api import info_routes, routes
from serve.api.engine_client import EngineClient
from serve.api.guards import HttpGuard, HttpLimits
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
    limits: HttpLimits = field(default_factory=HttpLimits)
    # tokenization and chat templates run here, off the event loop (a 1 MB prompt takes
    # ~100 ms to tokenize; /health and streams keep going meanwhile)
    tokenize_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="tokenize"))
    max_token_chars: int | None = None   # longest vocabulary entry (prompt-length bound)
    tool_call_parser: str = "hermes"     # resolved --tool-call-parser (serve.api.tool_parsers)
    reasoning_parser: str | None = None  # resolved --reasoning-parser (serve.api.reasoning)


def _error(status: int, message: str, type_: str, code=None, param=None) -> JSONResponse:
    return JSONResponse(ApiError(status, message, param, type_, code).body(), status_code=status)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=getattr(exc, "headers", None))


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
    if state.client.closing:
        return _error(503, "the server is shutting down", "service_unavailable", "shutting_down")
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


def build_app(state: ServerState, api_key: str | None = None,
              allowed_origins: list[str] | None = None):
    """The ASGI app. api_key (or state.limits.api_key) protects /v1/* and /metrics; /health
    stays open. allowed_origins: CORS for browser clients of those origins ("*": any);
    None sends no CORS headers, so browsers keep other sites from reading responses."""
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            *info_routes.ROUTES,   # /v1/models/{id}, /tokenize, /detokenize, /version
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                            Exception: _internal_error},
    )
    app.state.server = state
    if state.client is not None:
        state.client.on_timestamps = state.metrics.observe_engine_timestamps
    if api_key is not None:
        state.limits.api_key = api_key
    outer = app
    if allowed_origins:
        from starlette.middleware.cors import CORSMiddleware
        outer = CORSMiddleware(outer, allow_origins=list(allowed_origins),
                               allow_methods=["GET", "POST"],
                               allow_headers=["authorization", "content-type"], max_age=600)
    # the guard is outermost: CORS preflights from a foreign Host are refused too
    return HttpGuard(outer, state.limits)
