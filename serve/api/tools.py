"""Chat-completion tools and structured output: request validation, prompt rendering and the
grammars that enforce `tool_choice` and `response_format`.

- `tools` are rendered through the model's HF chat template (`apply_chat_template(tools=)`).
  A template that does not know tools (its source never mentions them) gets a Hermes-style
  system preamble listing them instead, assistant `tool_calls` rendered as `<tool_call>`
  blocks and tool results as `<tool_response>` blocks, so any chat model can be offered tools.
- `tool_choice`: "auto" (the default with tools): the model decides, its calls are parsed;
  "none": tools are not rendered and nothing is parsed; "required" / a named function: the
  output is constrained by a grammar to one or more calls (exactly one for a named function
  or `parallel_tool_calls: false`) of the offered functions, arguments valid against each
  function's `parameters` schema.
- `response_format`: {"type": "text"} (no constraint), {"type": "json_object"} (any JSON
  object), {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (a value valid
  against the schema; always enforced, whatever `strict` says).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from serve import constrained
from serve.api.protocol import bad
from serve.api.tool_parsers import PARSERS

_HERMES_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


@dataclass
class ToolRequest:
    tools: list[dict] = field(default_factory=list)   # [{"type": "function", "function": {...}}]
    choice: str = "auto"                               # auto | none | required | named
    named: str | None = None                           # the function tool_choice names
    parallel: bool = True

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


def parse_tools(body: dict) -> ToolRequest | None:
    """`tools`, `tool_choice`, `parallel_tool_calls` of a chat request; None without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "'tool_choice' needs 'tools'")
        return None
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of {'type': 'function', 'function': {...}}")
    req = ToolRequest(parallel=parallel)
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" \
                or not isinstance(t.get("function"), dict):
            raise bad(p, f"'{p}' must be {{'type': 'function', 'function': {{...}}}}")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64 \
                or not all(c.isalnum() or c in "_-." for c in name):
            raise bad(f"{p}.function.name", f"'{p}.function.name' must be 1-64 characters of "
                      "a-z, A-Z, 0-9, '_', '-', '.'")
        if name in req.names:
            raise bad(f"{p}.function.name", f"function name {name!r} is given twice")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad(f"{p}.function.parameters", f"'{p}.function.parameters' must be a JSON "
                      "Schema object")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"{p}.function.description", f"'{p}.function.description' must be a string")
        clean = {"name": name, "parameters": params}
        if desc is not None:
            clean["description"] = desc
        req.tools.append({"type": "function", "function": clean})
    if choice is None or choice in ("auto", "none", "required"):
        req.choice = choice or "auto"
    elif isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        req.choice, req.named = "named", choice["function"]["name"]
        if req.named not in req.names:
            raise bad("tool_choice", f"'tool_choice' names {req.named!r}, which is not in 'tools'")
    else:
        raise bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                  "{'type': 'function', 'function': {'name': ...}}")
    return req


def parse_response_format(body: dict) -> dict | None:
    """The JSON schema the output must match ({} = any JSON object), or None (free text)."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("response_format", "'response_format' must be {'type': 'text' | "
                  "'json_object' | 'json_schema', ...}")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return {"type": "object"}
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("name"), str):
        raise bad("response_format.json_schema", "'response_format.json_schema' must be an "
                  "object with a 'name' and a 'schema'")
    schema = js.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise bad("response_format.json_schema.schema", "'response_format.json_schema.schema' "
                  "must be a JSON Schema object")
    return schema


_RESERVED_TEMPLATE_ARGS = {"messages", "conversation", "tools", "documents", "tokenize",
                           "add_generation_prompt", "continue_final_message", "chat_template"}


def parse_template_kwargs(body: dict) -> dict:
    """`chat_template_kwargs` (vLLM's extension): extra variables for the chat template, such
    as Qwen3's `enable_thinking`; plain JSON values, names the server sets itself refused."""
    v = body.get("chat_template_kwargs")
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and k.isidentifier() for k in v):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object whose keys "
                  "are template variable names")
    clash = sorted(set(v) & _RESERVED_TEMPLATE_ARGS)
    if clash:
        raise bad("chat_template_kwargs", f"'chat_template_kwargs' cannot set {clash}")
    return v


# ---- messages ---------------------------------------------------------------------------------
def message_tool_fields(m: dict, param: str) -> dict:
    """The tool fields of one request message, validated, in the shape HF chat templates use
    (assistant `tool_calls` with parsed `arguments`; tool `tool_call_id`)."""
    out = {}
    if m.get("role") == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise bad(f"{param}.tool_calls", f"'{param}.tool_calls' must be a list")
        out["tool_calls"] = []
        for j, c in enumerate(calls):
            p = f"{param}.tool_calls[{j}]"
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments", "{}"), str) or not isinstance(c.get("id"), str):
                raise bad(p, f"'{p}' must be {{'id': str, 'type': 'function', 'function': "
                          "{'name': str, 'arguments': str}}")
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                raise bad(f"{p}.function.arguments", f"'{p}.function.arguments' is not valid "
                          "JSON") from None
            out["tool_calls"].append({"id": c["id"], "type": "function",
                                      "function": {"name": fn["name"], "arguments": args}})
    if m.get("role") == "tool":
        tcid = m.get("tool_call_id")
        if not isinstance(tcid, str) or not tcid:
            raise bad(f"{param}.tool_call_id", f"'{param}.tool_call_id' is required for tool "
                      "messages")
        out["tool_call_id"] = tcid
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _link_tool_names(messages: list[dict]) -> None:
    """Tool results get the name of the call they answer (templates such as Llama's use it)."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls", ())}
    for m in messages:
        if m["role"] == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]


def template_knows_tools(tokenizer) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def _as_hermes_text(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages for a template without tool support: tools and calls rendered as text."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            blocks = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                               "arguments": c["function"]["arguments"]}, ensure_ascii=False) +
                               "\n</tool_call>" for c in m.pop("tool_calls"))
            m["content"] = (m["content"] + "\n" if m["content"] else "") + blocks
        if m["role"] == "tool":   # results of one turn's calls share one user message
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
                continue
            m = {"role": "user", "content": block, "tool_results": True}
        out.append(m)
    for m in out:
        m.pop("tool_results", None)
    if tools:
        pre = _HERMES_PREAMBLE.format(tools="\n".join(json.dumps(t, ensure_ascii=False)
                                                      for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + pre}
        else:
            out.insert(0, {"role": "system", "content": pre})
    return out


def render_chat(tokenizer, messages: list[dict], tools: ToolRequest | None,
                template_kwargs: dict | None = None) -> str:
    """The prompt text: messages (and the offered tools, unless tool_choice is 'none')."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad("messages", "this model has no chat template; use /v1/completions")
    offered = tools.tools if tools is not None and tools.choice != "none" else None
    messages = [dict(m) for m in messages]
    _link_tool_names(messages)
    kwargs = dict(template_kwargs or {})
    if template_knows_tools(tokenizer):
        if offered:
            kwargs["tools"] = offered
    else:
        messages = _as_hermes_text(messages, offered)
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False, **kwargs)
    except Exception as e:   # jinja2 raises for e.g. roles that do not alternate
        raise bad("messages", f"the chat template rejected the messages: {e}") from None


def resolve_tool_parser(name: str, tokenizer) -> str:
    """'auto' -> 'mistral' for templates with [TOOL_CALLS], 'llama3_json' for templates that
    write Llama 3 JSON calls, else 'hermes' (Qwen / Hermes templates, and templates without
    tools, which get the Hermes preamble)."""
    if name != "auto":
        if name not in PARSERS:
            raise ValueError(f"--tool-call-parser: expected auto or one of {PARSERS}, got {name!r}")
        return name
    tpl = getattr(tokenizer, "chat_template", None) or ""
    if "<tool_call>" in tpl or not template_knows_tools(tokenizer):
        return "hermes"
    if "[TOOL_CALLS]" in tpl:
        return "mistral"
    if "<|python_tag|>" in tpl or '"parameters"' in tpl or "parameters" in tpl:
        return "llama3_json"
    return "hermes"


# ---- grammars ---------------------------------------------------------------------------------
def _call_schema(tools: list[dict], args_key: str) -> dict:
    options = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]}, args_key: t["function"]["parameters"]},
        "required": ["name", args_key], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


# A reasoning block the constrained output may start with: "<think>" ... "</think>" (lazy: it
# ends at the first "</think>"), or, when the completion starts inside the reasoning
# (deepseek_r1, or a prompt that opened <think>), everything up to the first "</think>".
_THINK_RULES = {
    "optional": 'start: think? answer\nthink: think_text /[ \\t\\r\\n]{0,8}/\n'
                'think_text[lazy]: "<think>" /(?s:.*)<\\/think>/\n',
    "inside": 'start: think answer\nthink: think_text /[ \\t\\r\\n]{0,8}/\n'
              'think_text[lazy]: /(?s:.*)<\\/think>/\n',
}


def _grammar(answer_rules: str, param: str, reasoning: str | None) -> str:
    """Lark rules defining `answer` -> llguidance grammar text, validated (400 naming param).
    reasoning: None, "optional" or "inside" (_THINK_RULES)."""
    head = _THINK_RULES[reasoning] if reasoning else "start: answer\n"
    grammar = constrained.lark_grammar(head + answer_rules)
    _check(grammar, param)
    return grammar


def _json_rule(name: str, schema) -> str:
    return f"{name}: %json {json.dumps(constrained.json_options(schema))}\n"


def tool_grammar(req: ToolRequest, parser: str, reasoning: str | None = None) -> str | None:
    """The grammar that forces calls (tool_choice required / named), or None."""
    if req.choice not in ("required", "named"):
        return None
    tools = [t for t in req.tools if req.choice != "named" or t["function"]["name"] == req.named]
    many = req.parallel and req.choice == "required"
    if parser == "hermes":
        rules = ('answer: call' + (' ("\\n" call)*' if many else '') + '\n'
                 'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
                 + _json_rule("body", _call_schema(tools, "arguments")))
    elif parser == "mistral":
        rules = ('answer: "[" body' + (' (", " body)*' if many else '') + ' "]"\n'
                 + _json_rule("body", _call_schema(tools, "arguments")))
    else:
        rules = ('answer: body' + (' ("; " body)*' if many else '') + '\n'
                 + _json_rule("body", _call_schema(tools, "parameters")))
    return _grammar(rules, "tools", reasoning)


def response_grammar(schema: dict | bool, reasoning: str | None = None) -> str:
    return _grammar(_json_rule("answer", schema), "response_format", reasoning)


def _check(grammar: str, param: str) -> None:
    err = constrained.validate_grammar(grammar)
    if err:
        raise bad(param, f"'{param}' cannot be enforced: {err.strip()}")
