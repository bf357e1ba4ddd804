"""Agent sessions to replay: synthetic ones from a fixed seed, or real ones from a JSONL file.

A session is a conversation that grows turn by turn. Turn 1 carries the shared system prompt
and the session's repository context (tens of thousands of tokens); every later turn appends a
tool result (~800 tokens) to everything said so far, including the text the server generated
for the previous turns, so each request's prompt is the previous request's prompt + output +
the new tool output. That is the prefix an engine's cache can reuse.

JSONL schema (one session per line, OpenAI chat format)::

    {"id": "optional-name",
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "...recorded reply..."},
                  {"role": "tool", "tool_call_id": "call_1", "content": "...tool output..."},
                  ...],
     "think_time_s": [0.5, 1.2]}          # optional, seconds before each later turn

Every assistant message closes a turn: the messages before it are sent (together with the
replies generated so far, which replace the recorded ones, so the prefix stays exact) and the
recorded reply's length, in words, sets that turn's `max_tokens`. Messages after the last
assistant message are ignored. `tool` messages are sent as `user` messages carrying the tool
output when `tool_role=False` (for servers whose templates reject tool turns without tool calls).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

# Common English words: most BPE vocabularies hold each (with its leading space) as one token,
# so N words are close to N tokens; the benchmark reports the server's own token counts anyway.
_WORDS = (
    "the of and to in is for on with as by at from that this be are or an it not which have "
    "file line code function return value error test class module import call data type list "
    "string number result change build run check path name input output config default user "
    "state model version update local server client request response time start end first "
    "next last new old read write open close find make use add remove set get show need "
    "should would could will can may must each every other more most some any all only same "
    "when where what how why because if then else while after before about over under into "
    "out up down left right true false none null zero one two three four five six seven eight"
).split()


@dataclass
class Turn:
    """Messages appended before this request, and how many tokens the reply may take."""
    new_messages: list[dict]
    max_tokens: int
    think_time_s: float = 0.0        # wait before sending this turn (0 for the first)


@dataclass
class Session:
    id: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turns)


def _text(rng: random.Random, n_words: int, tag: str) -> str:
    # A distinct opening per text keeps two sessions' contexts from sharing a prefix by chance.
    body = " ".join(rng.choice(_WORDS) for _ in range(max(0, n_words)))
    return f"[{tag}] {body}"


def synthetic_sessions(n: int, *, seed: int = 0, system_tokens: int = 2000,
                       context_tokens: int = 48000, turns: tuple[int, int] = (10, 15),
                       turn_tokens: int = 800, output_tokens: tuple[int, int] = (300, 500),
                       think_time_s: float = 1.0) -> list[Session]:
    """`n` coding-agent sessions drawn from `seed` (the same seed gives the same sessions).

    system_tokens: the system prompt every session shares. context_tokens: the repository
    context of the session's first turn (its own). turns: inclusive range of turns per session.
    turn_tokens: tool output appended per later turn. output_tokens: inclusive range of each
    reply's max_tokens. think_time_s: mean of the exponential wait before each later turn.
    """
    if n < 0 or system_tokens < 0 or context_tokens < 0 or turn_tokens < 0:
        raise ValueError("sessions, system_tokens, context_tokens and turn_tokens must be >= 0")
    if not (1 <= turns[0] <= turns[1]) or not (1 <= output_tokens[0] <= output_tokens[1]):
        raise ValueError(f"turns {turns} and output_tokens {output_tokens} must be ranges lo <= hi, lo >= 1")
    shared = random.Random(seed)
    system = "You are a coding agent working in a repository. " + _text(shared, system_tokens, "system")
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{i}")
        k = rng.randint(*turns)
        first = [{"role": "system", "content": system},
                 {"role": "user", "content": "Repository context follows. "
                  + _text(rng, context_tokens, f"repo {i}") + "\nFix the failing test."}]
        session = Session(id=f"s{seed}-{i}", turns=[Turn(first, rng.randint(*output_tokens))])
        for t in range(1, k):
            msg = {"role": "user", "content": f"Tool output (step {t}): "
                   + _text(rng, turn_tokens, f"tool {i}.{t}")}
            wait = rng.expovariate(1.0 / think_time_s) if think_time_s > 0 else 0.0
            session.turns.append(Turn([msg], rng.randint(*output_tokens), wait))
        out.append(session)
    return out


def load_jsonl(path: str | Path, *, tool_role: bool = True, max_sessions: int | None = None
               ) -> list[Session]:
    """Sessions from a JSONL file in the schema of this module's docstring."""
    sessions = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{path}:{lineno}: expected an object with a non-empty 'messages' list")
        waits = row.get("think_time_s") or []
        session = Session(id=str(row.get("id", f"line{lineno}")))
        pending: list[dict] = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) \
                    or m.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"{path}:{lineno}: message {j} needs a role in system/user/"
                                 "assistant/tool and a string content")
            if m["role"] == "assistant":
                if not pending:
                    raise ValueError(f"{path}:{lineno}: message {j}: an assistant message must "
                                     "follow at least one other message")
                n_words = max(1, len(m["content"].split()))
                k = len(session.turns)
                wait = float(waits[k - 1]) if k and k - 1 < len(waits) else 0.0
                session.turns.append(Turn(pending, n_words, wait))
                pending = []
            elif m["role"] == "tool" and not tool_role:
                pending.append({"role": "user", "content": m["content"]})
            else:
                pending.append({k: v for k, v in m.items() if k in ("role", "content", "tool_call_id", "name")})
        if not session.turns:
            raise ValueError(f"{path}:{lineno}: no assistant message, so no turn to replay")
        sessions.append(session)
        if max_sessions is not None and len(sessions) >= max_sessions:
            break
    return sessions
