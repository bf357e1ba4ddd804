"""/v1/completions and /v1/chat/completions: tokenize, check limits, run, format (JSON or SSE).

A client that goes away is noticed while we wait on the engine (not only when a write
fails), so a request still queued in the engine is aborted too and its KV pages freed.
"""
from __future__ import annotations

import asyncio
import json
import time
from functools import lru_cache

from starlette.requests import Request
from starlette.responses import JSONResponse

from serve.api.engine_client import (
    EngineDeadError,
    EngineRejectedError,
    OverloadedError,
    ShuttingDownError,
)
from serve.api.generation import Delta, Generation
from serve.api.guards import parse_json, read_body
from serve.api.protocol import ApiError, GenerateSpec, bad, parse_chat, parse_completion
from serve.api.structured import chat_output_factory, prepare_grammar
from serve.api.tools import render_chat


class ClientGone(Exception):
    pass


async def completions(request: Request):
    return await _generate(request, chat=False)


async def chat_completions(request: Request):
    return await _generate(request, chat=True)


async def _generate(request: Request, chat: bool):
    state = request.app.state.server
    endpoint = "chat" if chat else "completions"
    arrival = time.monotonic()
    try:
        response = await _run(request, state, chat, arrival)
        state.metrics.requests.inc(endpoint=endpoint, status="200")
        return response
    except ApiError as e:
        state.metrics.requests.inc(endpoint=endpoint, status=str(e.status))
        raise
    except ClientGone:
        state.metrics.requests.inc(endpoint=endpoint, status="499")
        return JSONResponse({}, status_code=499)


async def _run(request: Request, state, chat: bool, arrival: float):
    body = parse_json(await read_body(request, state.limits))
    spec = parse_chat(body) if chat else parse_completion(body)
    if spec.model is not None and spec.model not in state.model_names:
        raise ApiError(404, f"the model '{spec.model}' does not exist; this server serves "
                       f"'{state.model_name}'", param="model", code="model_not_found")
    _check_size_before_tokenizing(state, spec)
    loop = asyncio.get_running_loop()
    if chat:
        prompts = [await loop.run_in_executor(state.tokenize_pool, _chat_prompt, state.tokenizer,
                                              spec)]
    else:
        prompts = await loop.run_in_executor(
            state.tokenize_pool, lambda: [_completion_prompt(state.tokenizer, p)
                                          for p in spec.prompts])
    max_tokens = [_check_lengths(state, spec, p) for p in prompts]
    await loop.run_in_executor(state.tokenize_pool, prepare_grammar, spec, state.tool_call_parser,
                               state.reasoning_parser)
    _check_token_ids(state, spec, prompts)

    gen = Generation(state.client, state.tokenizer, state.metrics, spec, prompts, max_tokens, arrival,
                     chat_output_factory(state, spec) if chat else None)
    streaming = False   # once the event stream owns `gen`, it closes it
    try:
        gen.start()
        if spec.stream:
            deltas = gen.deltas()
            # Wait for the first output before sending headers, so engine errors get a status.
            first = await _unless_disconnected(request, deltas.__anext__())
            streaming = True
            return _EventStream(gen, _sse_chunks(state, gen, first, deltas))
        await _unless_disconnected(request, _drain(gen))
        return JSONResponse(_full_response(state, gen))
    except OverloadedError as e:
        err = ApiError(503, str(e), type_="service_unavailable", code="server_overloaded")
        err.headers = {"Retry-After": "1"}
        raise err from None
    except EngineDeadError as e:
        raise ApiError(503, str(e), type_="service_unavailable", code=_dead_code(e)) from None
    except EngineRejectedError as e:
        raise ApiError(400, f"the engine rejected the request: {e}") from None
    finally:
        if not streaming:
            gen.close()


def _dead_code(e: EngineDeadError) -> str:
    return "shutting_down" if isinstance(e, ShuttingDownError) else "engine_dead"


def _check_size_before_tokenizing(state, spec: GenerateSpec) -> None:
    """400s decided from the request alone, before any tokenizer work: too many engine
    requests (prompts x n), or text that cannot fit in the context whatever it tokenizes to
    (a token is never longer than the longest vocabulary entry, so more characters than
    max_model_len x that length is more than max_model_len tokens)."""
    limits = state.limits
    num = spec.n * (1 if spec.chat else len(spec.prompts))
    if num > limits.max_choices:
        raise bad("n", f"the request asks for {num} completions (prompts x n); this server "
                  f"allows at most {limits.max_choices} per request (--max-choices-per-request)")
    if state.max_token_chars is None:
        vocab = state.tokenizer.get_vocab()
        state.max_token_chars = max((len(t) for t in vocab), default=1) or 1
    bound = state.max_model_len * state.max_token_chars
    param = "messages" if spec.chat else "prompt"
    texts = [m.get("content") for m in spec.messages] if spec.chat else spec.prompts
    texts = [t for t in texts if isinstance(t, str)]
    chars = sum(len(t) for t in texts) if spec.chat else max((len(t) for t in texts), default=0)
    too_long = chars > bound or (not spec.chat and any(
        isinstance(p, list) and len(p) >= state.max_model_len for p in spec.prompts))
    if too_long:
        raise ApiError(400, f"this model's maximum context length is {state.max_model_len} "
                       f"tokens; the {param} is longer than that", param=param,
                       code="context_length_exceeded")


def _completion_prompt(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, list):
        return list(prompt)
    return tokenizer.encode(prompt, add_special_tokens=True)


def _chat_prompt(tokenizer, spec: GenerateSpec) -> list[int]:
    text = render_chat(tokenizer, spec.messages, spec.tools,   # 400 when the template refuses
                       spec.chat_template_kwargs)
    spec.prompt_tail = text[-64:]   # reasoning parsers look for a <think> the template opened
    return tokenizer.encode(text, add_special_tokens=False)


def _check_lengths(state, spec: GenerateSpec, prompt: list[int]) -> int:
    """Returns this prompt's max_tokens; 400 when prompt + completion cannot fit."""
    param = "messages" if spec.chat else "prompt"
    limit = state.max_model_len
    if not prompt:
        raise bad(param, "the prompt is empty")
    if len(prompt) >= limit:
        raise ApiError(400, f"the prompt is {len(prompt)} tokens; this model's maximum context "
                       f"length (max-model-len) is {limit}", param=param, code="context_length_exceeded")
    if spec.max_tokens is not None and spec.max_tokens > limit:
        raise bad("max_tokens", f"'max_tokens' is {spec.max_tokens}, more than max-model-len ({limit})")
    max_tokens = spec.max_tokens if spec.max_tokens is not None else limit - len(prompt)
    if len(prompt) + max_tokens > limit:
        raise ApiError(400, f"this model's maximum context length is {limit} tokens; the request "
                       f"asks for {len(prompt) + max_tokens} ({len(prompt)} in the prompt, "
                       f"{max_tokens} to generate)", param="max_tokens", code="context_length_exceeded")
    return max_tokens


def _check_token_ids(state, spec: GenerateSpec, prompts: list[list[int]]) -> None:
    vocab = len(state.tokenizer)
    if any(t >= vocab for t in spec.stop_token_ids):
        raise bad("stop_token_ids", f"token ids must be < the vocabulary size {vocab}")
    if any(t >= vocab for p in prompts for t in p):
        raise bad("prompt", f"token ids must be < the vocabulary size {vocab}")
    if any(t >= vocab for t, _ in spec.logit_bias):
        raise bad("logit_bias", f"token ids must be < the vocabulary size {vocab}")


async def _drain(gen: Generation) -> None:
    async for _ in gen.deltas():
        pass


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, awaitable):
    """Awaits `awaitable` unless the client disconnects first (then raises ClientGone)."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientGone()
    finally:
        for task in (work, watch):
            task.cancel()


class _EventStream:
    """A text/event-stream response that stops (and aborts the generation) on disconnect."""

    def __init__(self, gen: Generation, chunks):
        self.gen, self.chunks = gen, chunks

    async def __call__(self, scope, receive, send):
        async def stream():
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        work = asyncio.ensure_future(stream())
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work.done() and not work.cancelled() and work.exception() is not None:
                if not isinstance(work.exception(), OSError):   # OSError: the client went away
                    raise work.exception()
        finally:
            for task in (work, watch):
                task.cancel()
            self.gen.close()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse_chunks(state, gen: Generation, first: Delta, deltas):
    spec = gen.spec
    usage_field = {"usage": None} if spec.include_usage else {}
    if spec.chat:
        for c in gen.choices:   # OpenAI opens every choice with the role
            yield _sse(_chunk(state, gen, [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}], usage_field))
    delta = first
    try:
        while True:
            # a token whose text is still incomplete (or empty) sends no chunk, unless the
            # client asked for token ids: then every token arrives as it is made
            if (delta.fields if spec.chat else delta.text) or delta.logprobs \
                    or delta.finish_reason or (spec.return_token_ids and delta.token_ids):
                yield _sse(_chunk(state, gen, [_delta_choice(state, gen, delta)], usage_field))
            try:
                delta = await deltas.__anext__()
            except StopAsyncIteration:
                break
    except EngineDeadError as e:
        yield _sse(ApiError(503, str(e), type_="service_unavailable", code=_dead_code(e)).body())
    else:
        if spec.include_usage:
            yield _sse(_chunk(state, gen, [], {"usage": gen.usage()}))
    yield "data: [DONE]\n\n"


def _chunk(state, gen: Generation, choices: list, extra: dict) -> dict:
    kind = "chat.completion.chunk" if gen.spec.chat else "text_completion"
    return {"id": _response_id(gen), "object": kind, "created": gen.created,
            "model": state.model_name, "choices": choices, **extra}


def _delta_choice(state, gen: Generation, d: Delta) -> dict:
    if gen.spec.chat:
        out = {"index": d.choice.index, "delta": d.fields or {},
               "logprobs": _chat_logprobs(state, d.logprobs) if gen.spec.logprobs is not None else None}
    else:
        offset = len(d.choice.text) - len(d.text)
        out = {"index": d.choice.index, "text": d.text,
               "logprobs": _completion_logprobs(state, d.logprobs, offset)
               if gen.spec.logprobs is not None else None}
    if gen.spec.return_token_ids:
        out["token_ids"] = d.token_ids
    out["finish_reason"] = d.finish_reason
    return out


def _full_response(state, gen: Generation) -> dict:
    choices = []
    for c in gen.choices:
        if gen.spec.chat:
            choice = {"index": c.index, "message": c.chat_out.message(),
                      "logprobs": _chat_logprobs(state, c.logprobs) if gen.spec.logprobs is not None else None}
        else:
            choice = {"index": c.index, "text": c.text,
                      "logprobs": _completion_logprobs(state, c.logprobs, 0)
                      if gen.spec.logprobs is not None else None}
        if gen.spec.return_token_ids:
            choice["token_ids"] = c.token_ids
        choice["finish_reason"] = c.finish_reason
        choices.append(choice)
    kind = "chat.completion" if gen.spec.chat else "text_completion"
    return {"id": _response_id(gen), "object": kind, "created": gen.created,
            "model": state.model_name, "choices": choices, "usage": gen.usage()}


def _response_id(gen: Generation) -> str:
    return ("chatcmpl-" if gen.spec.chat else "cmpl-") + gen.id


def _completion_logprobs(state, entries: list, offset: int) -> dict:
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token_id, logprob, alternatives in entries:
        text = _token_text(state.tokenizer, token_id)
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append({_token_text(state.tokenizer, t): lp for t, lp in alternatives})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}


def _chat_logprobs(state, entries: list) -> dict:
    def item(token_id, logprob):
        text = _token_text(state.tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    return {"content": [{**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in alternatives]}
                        for t, lp, alternatives in entries]}


@lru_cache(maxsize=1 << 16)
def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([int(token_id)], skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)
