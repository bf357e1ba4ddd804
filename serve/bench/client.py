"""One streamed chat completion over the OpenAI API, timed token by token on the client."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestRecord:
    """What the client saw of one request (times are `time.perf_counter()` seconds)."""
    session: str
    turn: int
    sent: float
    first_token: float | None = None
    last_token: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # arrival of each content chunk
    text: str = ""
    prompt_tokens: int | None = None                          # from the server's usage
    completion_tokens: int | None = None
    cached_tokens: int | None = None                          # usage.prompt_tokens_details
    finish_reason: str | None = None
    error: str | None = None                                  # kind, e.g. "http_429", "timeout"

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """The server's completion count, else the number of content chunks."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first token (the user's reading speed: TPS/user)."""
        n = self.output_tokens
        if self.first_token is None or self.last_token is None or n < 2:
            return None
        dt = self.last_token - self.first_token
        return (n - 1) / dt if dt > 0 else None


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"http_{exc.response.status_code}"
    if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
        return "connection"
    if isinstance(exc, (json.JSONDecodeError, KeyError, TypeError, ValueError)):
        return "bad_stream"
    return type(exc).__name__


def render_plain(messages: list[dict]) -> str:
    """The conversation as one text prompt (for /v1/completions: models without a chat
    template). Appending a turn only appends text, so a turn's prompt extends the last one's."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


async def stream_chat(client: httpx.AsyncClient, url: str, model: str, messages: list[dict],
                      max_tokens: int, record: RequestRecord, *, ignore_eos: bool = True,
                      temperature: float = 0.0, timeout_s: float = 600.0,
                      headers: dict | None = None, endpoint: str = "chat") -> RequestRecord:
    """Stream one request and fill `record` as chunks arrive: POST /v1/chat/completions, or
    with endpoint="completions" /v1/completions on `render_plain(messages)`."""
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": temperature}
    if endpoint == "chat":
        body["messages"] = messages
        path = "/v1/chat/completions"
    elif endpoint == "completions":
        body["prompt"] = render_plain(messages)
        path = "/v1/completions"
    else:
        raise ValueError(f"endpoint: expected 'chat' or 'completions', got {endpoint!r}")
    if ignore_eos:
        body["ignore_eos"] = True    # an extension vLLM and this server take: exact output lengths
        # (same servers) a chunk per token even while its text is incomplete: TTFT and ITL
        # time tokens, not visible characters (a random dummy model's ids past the tokenizer's
        # vocabulary decode to nothing)
        body["return_token_ids"] = True
    try:
        async with client.stream("POST", url.rstrip("/") + path, json=body,
                                 headers=headers, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                await resp.aread()
                record.error = f"http_{resp.status_code}"
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = "stream_error"
                    break
                now = time.perf_counter()
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = (delta.get("content") or delta.get("reasoning_content")
                             or choice.get("text") or "")
                    if piece or choice.get("token_ids"):
                        record.first_token = record.first_token or now
                        record.last_token = now
                        record.chunk_times.append(now)
                        record.text += delta.get("content") or choice.get("text") or ""
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage")
                if usage:
                    record.prompt_tokens = usage.get("prompt_tokens")
                    record.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    record.cached_tokens = details.get("cached_tokens")
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind, none is fatal
        record.error = _error_kind(exc)
    return record


async def scrape_metrics(client: httpx.AsyncClient, url: str, headers: dict | None = None
                         ) -> dict[str, float]:
    """The server's Prometheus samples (name with labels -> value); {} when unavailable."""
    try:
        resp = await client.get(url.rstrip("/") + "/metrics", headers=headers, timeout=10.0)
        resp.raise_for_status()
    except httpx.HTTPError:
        return {}
    out = {}
    for line in resp.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def counter(samples: dict[str, float], *suffixes: str) -> float | None:
    """Sum of the samples whose name (labels stripped) ends with one of `suffixes`."""
    total, seen = 0.0, False
    for name, value in samples.items():
        base = name.split("{", 1)[0]
        if base.endswith(suffixes):
            total += value
            seen = True
    return total if seen else None
