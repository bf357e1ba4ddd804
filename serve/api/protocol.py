"""OpenAI request bodies -> validated `GenerateSpec`; errors as OpenAI-style 4xx bodies.

Validation is explicit and field by field so that every rejection names the offending
parameter (`param` in the error body), the way the OpenAI API does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_N = 64
MAX_LOGPROBS = 20
MAX_STOP = 16
SEED_MAX = (1 << 63) - 1


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass
class GenerateSpec:
    """What one /v1/completions or /v1/chat/completions call asks for, before tokenization."""
    chat: bool
    model: str | None
    prompts: list = field(default_factory=list)      # completions: list of str | list[int]
    messages: list = field(default_factory=list)     # chat: list of {"role", "content"}
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None                      # None: off; k: k top alternatives
    stream: bool = False
    include_usage: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False                   # extension: choices carry "token_ids"
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0                  # extension (vLLM)
    logit_bias: list = field(default_factory=list)   # [(token_id, bias)]
    tools: object = None                             # serve.api.tools.ToolRequest | None
    response_schema: object = None                   # JSON schema the output must match
    grammar: str | None = None                       # llguidance grammar (set by routes)
    prompt_tail: str = ""                            # chat: the rendered prompt's end
    chat_template_kwargs: dict = field(default_factory=dict)   # extension, e.g. enable_thinking


class _Fields:
    """Typed getters over a JSON object; each raises a 400 naming the field."""

    def __init__(self, body: dict):
        self.body = body

    def _get(self, name, default):
        value = self.body.get(name)
        return default if value is None else value

    def int(self, name, default=None, lo=None, hi=None):
        v = self._get(name, default)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(name, f"'{name}' must be an integer, got {type(v).__name__}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise bad(name, f"'{name}' must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
        return v

    def float(self, name, default, lo=None, hi=None, lo_open=False):
        v = self._get(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad(name, f"'{name}' must be a finite number, got {v!r}")
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
            lo_s = f"({lo}" if lo_open else f"[{lo}"
            raise bad(name, f"'{name}' must be in {lo_s}, {hi if hi is not None else 'inf'}], got {v}")
        return float(v)

    def bool(self, name, default=False):
        v = self._get(name, default)
        if not isinstance(v, bool):
            raise bad(name, f"'{name}' must be a boolean, got {type(v).__name__}")
        return v

    def str(self, name, default=None):
        v = self._get(name, default)
        if v is not None and not isinstance(v, str):
            raise bad(name, f"'{name}' must be a string, got {type(v).__name__}")
        return v

    def stop(self) -> list[str]:
        v = self._get("stop", [])
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            raise bad("stop", "'stop' must be a non-empty string or a list of non-empty strings")
        if len(v) > MAX_STOP:
            raise bad("stop", f"at most {MAX_STOP} stop strings are supported")
        return v

    def int_list(self, name) -> list[int]:
        v = self._get(name, [])
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in v):
            raise bad(name, f"'{name}' must be a list of non-negative integers")
        return v


# Known OpenAI fields this server does not implement -> the values that mean "not used".
# A clear 400 beats silently ignoring them. Fields not listed anywhere here are ignored
# (documented in docs/OPENAI_FEATURES.md: user, metadata, service_tier, store=false, ...).
_UNSUPPORTED = {"echo": (False,), "suffix": ("",), "functions": ([],),
                "function_call": ("none", "auto"), "best_of": (1,), "audio": (),
                "modalities": (["text"],), "prediction": (), "web_search_options": (),
                "store": (False,), "reasoning_effort": (), "verbosity": ()}
MAX_LOGIT_BIAS = 1024


def _reject_unsupported(body: dict) -> None:
    for name, neutral in _UNSUPPORTED.items():
        v = body.get(name)
        if v is not None and v not in neutral and not (name == "best_of" and v == body.get("n")):
            raise bad(name, f"'{name}' is not supported by this server")


def _common(f: _Fields, spec: GenerateSpec) -> GenerateSpec:
    _reject_unsupported(f.body)
    spec.model = f.str("model")
    spec.n = f.int("n", 1, lo=1, hi=MAX_N)
    spec.temperature = f.float("temperature", 1.0, lo=0.0)
    spec.top_p = f.float("top_p", 1.0, lo=0.0, hi=1.0, lo_open=True)
    spec.top_k = f.int("top_k", -1, lo=-1)
    spec.top_k = -1 if spec.top_k == 0 else spec.top_k
    spec.min_p = f.float("min_p", 0.0, lo=0.0, hi=1.0)
    # the sampler keys on 63-bit seeds: larger ones used to wrap silently (2**70 sampled like 0)
    spec.seed = f.int("seed", lo=0, hi=SEED_MAX)
    spec.stop = f.stop()
    spec.stop_token_ids = f.int_list("stop_token_ids")
    spec.ignore_eos = f.bool("ignore_eos")
    spec.skip_special_tokens = f.bool("skip_special_tokens", True)
    spec.return_token_ids = f.bool("return_token_ids")
    spec.stream = f.bool("stream")
    spec.presence_penalty = f.float("presence_penalty", 0.0, lo=-2.0, hi=2.0)
    spec.frequency_penalty = f.float("frequency_penalty", 0.0, lo=-2.0, hi=2.0)
    spec.repetition_penalty = f.float("repetition_penalty", 1.0, lo=0.0, hi=10.0, lo_open=True)
    spec.logit_bias = _logit_bias(f.body.get("logit_bias"))
    from serve.api.tools import parse_response_format   # late: tools imports this module
    spec.response_schema = parse_response_format(f.body)
    opts = f.body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("stream_options", "'stream_options' must be an object")
        if not spec.stream:
            raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
        spec.include_usage = _Fields(opts).bool("include_usage")
    return spec


def _logit_bias(v) -> list:
    """OpenAI's {"token_id": bias} map (keys are strings in JSON) -> [(id, bias)]."""
    if v is None:
        return []
    if not isinstance(v, dict):
        raise bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"'logit_bias' has {len(v)} entries; at most {MAX_LOGIT_BIAS}")
    out = []
    for k, b in v.items():
        try:
            t = int(k)
        except (TypeError, ValueError):
            t = -1
        if t < 0 or str(t) != str(k).strip():
            raise bad("logit_bias", f"'logit_bias' keys must be token ids, got {k!r}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad("logit_bias", f"'logit_bias' values must be numbers in [-100, 100], got {b!r}")
        out.append((t, float(b)))
    return out


def parse_completion(body) -> GenerateSpec:
    f = _fields_of(body)
    for name in ("tools", "tool_choice"):
        if f.body.get(name) is not None:
            raise bad(name, f"'{name}' is a chat completions parameter")
    spec = _common(f, GenerateSpec(chat=False, model=None))
    spec.max_tokens = f.int("max_tokens", 16, lo=1)
    spec.logprobs = f.int("logprobs", None, lo=0, hi=MAX_LOGPROBS)
    spec.prompts = _prompts(body.get("prompt"))
    return spec


def parse_chat(body) -> GenerateSpec:
    f = _fields_of(body)
    spec = _common(f, GenerateSpec(chat=True, model=None))
    spec.max_tokens = f.int("max_completion_tokens", None, lo=1)
    if spec.max_tokens is None:
        spec.max_tokens = f.int("max_tokens", None, lo=1)
    top = f.int("top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
    if f.bool("logprobs"):
        spec.logprobs = top or 0
    elif top is not None:
        raise bad("top_logprobs", "'top_logprobs' requires 'logprobs': true")
    spec.messages = _messages(body.get("messages"))
    from serve.api.tools import parse_template_kwargs, parse_tools
    spec.tools = parse_tools(body)
    spec.chat_template_kwargs = parse_template_kwargs(body)
    if spec.tools is not None and spec.response_schema is not None and spec.tools.choice != "none":
        raise bad("response_format", "'response_format' cannot be combined with 'tools' "
                  "(unless 'tool_choice' is 'none')")
    return spec


def _fields_of(body) -> _Fields:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return _Fields(body)


def _prompts(prompt) -> list:
    """str | list[int] | list[str] | list[list[int]] -> list of (str | list[int])."""
    def is_ids(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool)
                                                 and t >= 0 for t in x)
    if isinstance(prompt, str):
        return [prompt]
    if is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return prompt
    if prompt is None:
        raise bad("prompt", "'prompt' is required")
    raise bad("prompt", "'prompt' must be a string, a list of token ids, or a non-empty list of those")


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _messages(messages) -> list[dict]:
    if messages is None:
        raise bad("messages", "'messages' is required")
    if not isinstance(messages, list):
        raise bad("messages", f"'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise bad("messages", "'messages' must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(param, f"'{param}' must be an object")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{param}.role", f"'{param}.role' must be one of {sorted(_ROLES)}, got {role!r}")
        from serve.api.tools import message_tool_fields
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(m.get("content"), f"{param}.content"),
                    **message_tool_fields(m, param)})
    return out


def _content(content, param: str) -> str:
    """A message's content: a string, null, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad(param, f"'{param}' parts must be {{'type': 'text', 'text': str}}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(param, f"'{param}' must be a string or a list of text parts")
