"""Model, tokenizer and version endpoints beside the generation API (vLLM's names):

    GET  /v1/models/{id}   one model card (404 for an id this server does not serve)
    POST /tokenize         {"prompt": str} or {"messages": [...]} (+ "add_special_tokens")
                           -> {"tokens": [...], "count", "max_model_len"}
    POST /detokenize       {"tokens": [int, ...]} -> {"prompt": str}
    GET  /version          {"version", "torch", "triton"}

Mounted by `serve.api.app.build_app` (ROUTES). Tokenizer work runs in a worker thread, as the
generation routes do, so a long prompt does not stall the event loop.
"""
from __future__ import annotations

import asyncio
import json
from importlib import metadata

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from serve.api.protocol import ApiError, bad

__all__ = ["ROUTES"]


def _card(state) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "tskernels", "max_model_len": state.max_model_len}


async def model_card(request: Request):
    state = request.app.state.server
    model_id = request.path_params["model_id"]
    if model_id not in (state.model_names or {state.model_name}) and model_id != state.model_name:
        raise ApiError(404, f"the model {model_id!r} does not exist; this server serves "
                            f"{state.model_name!r}", "model", "not_found_error", "model_not_found")
    return JSONResponse(_card(state))


async def _body(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"null")
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _tokenize(tokenizer, body: dict) -> list[int]:
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise bad("add_special_tokens", "add_special_tokens: expected a boolean")
    if ("prompt" in body) == ("messages" in body):
        raise bad("prompt", "send exactly one of 'prompt' (a string) or 'messages' (a list)")
    if "prompt" in body:
        if not isinstance(body["prompt"], str):
            raise bad("prompt", "prompt: expected a string")
        return list(tokenizer.encode(body["prompt"], add_special_tokens=add_special))
    messages = body["messages"]
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise bad("messages", "messages: expected a list of {'role': ..., 'content': ...}")
    if not getattr(tokenizer, "chat_template", None):
        raise bad("messages", "this model has no chat template; send 'prompt'")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=bool(
        body.get("add_generation_prompt", True)))
    return list(tokenizer.encode(text, add_special_tokens=False))


async def tokenize(request: Request):
    state = request.app.state.server
    body = await _body(request)
    ids = await asyncio.to_thread(_tokenize, state.tokenizer, body)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})


async def detokenize(request: Request):
    state = request.app.state.server
    tokens = (await _body(request)).get("tokens")
    vocab = len(state.tokenizer)
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad("tokens", "tokens: expected a list of token ids (ints)")
    wrong = [t for t in tokens if not 0 <= t < vocab]
    if wrong:
        raise bad("tokens", f"tokens: ids {wrong[:8]} are outside the vocabulary [0, {vocab})")
    text = await asyncio.to_thread(state.tokenizer.decode, tokens)
    return JSONResponse({"prompt": text})


def _v(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


async def version(request: Request):
    return JSONResponse({"version": _v("tskernels"), "torch": _v("torch"), "triton": _v("triton")})


ROUTES = [
    Route("/v1/models/{model_id:path}", model_card, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/version", version, methods=["GET"]),
]
