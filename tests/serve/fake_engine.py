"""A model-free engine with the `serve.engine` contract, for fast server tests.

Its tokenizer is byte-level (one token per UTF-8 byte, so every non-ASCII character spans
several tokens) with a chat template. It "generates" a fixed script that contains multi-byte
characters; greedy requests start the script at 0, sampled ones at an offset drawn from the
request's seed; a prompt containing "[reply]TEXT[/reply]" gets TEXT and then EOS (scripted
tool calls, reasoning). KV pages are accounted like a paged engine so /metrics can show a free pool.
Model names: "fake" (5 ms steps), "fake:slow" (50 ms steps), "fake:crash" (slow; the 20th step raises).

`ServerProcess` and `tiny_model` (bottom) launch `python -m serve` for the server test modules.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# the engine contract's own types (ipc looks SamplingParams up in this module)
from serve.sampling_params import RequestOutput, SamplingParams  # noqa: F401

SCRIPT = "Hello from the fake engine! 🙂 Ünïcödé 世界. The quick brown fox jumps over the lazy dog. "
EOS = "<|end|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, chat_template=CHAT_TEMPLATE)


@dataclass
class _Request:
    request_id: str
    prompt: list
    params: SamplingParams
    offset: int
    generated: int = 0
    reply: list | None = None     # the prompt's last "[reply]TEXT[/reply]": TEXT, then EOS


class FakeEngine:
    def __init__(self, model: str = "fake", max_model_len: int = 512, max_num_seqs: int = 8,
                 page_size: int = 16, num_kv_pages: int = 512, seed: int = 0, **ignored):
        self.tokenizer = make_tokenizer()
        self.model_name = model.split(":")[0] + "-model"
        self.max_model_len, self.max_num_seqs, self.page_size = max_model_len, max_num_seqs, page_size
        self.num_kv_pages = num_kv_pages
        self.step_delay = 0.05 if model.endswith((":slow", ":crash")) else 0.005
        self.crash_at_step = 20 if model.endswith(":crash") else None
        self._steps = 0
        self._script = self.tokenizer.encode(SCRIPT, add_special_tokens=False)
        self._eos = self.tokenizer.eos_token_id
        self._requests: dict[str, _Request] = {}
        self._order: list[str] = []
        self._generated_total = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError("prompt + max_tokens exceed max_model_len")
        if request_id in self._requests:
            raise ValueError(f"duplicate request id {request_id}")
        offset = 0 if params.temperature == 0 else random.Random(params.seed).randrange(len(self._script))
        self._requests[request_id] = _Request(request_id, list(prompt_token_ids), params, offset,
                                              reply=self._reply(prompt_token_ids))
        self._order.append(request_id)

    def _reply(self, prompt_token_ids) -> list | None:
        m = re.findall(r"\[reply\](.*?)\[/reply\]", self.tokenizer.decode(prompt_token_ids), re.S)
        return self.tokenizer.encode(m[-1], add_special_tokens=False) if m else None

    def abort(self, request_id: str) -> None:
        del self._requests[request_id]
        self._order.remove(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def step(self) -> list[RequestOutput]:
        self._steps += 1
        if self._steps == self.crash_at_step:
            raise RuntimeError("fake engine crash")
        time.sleep(self.step_delay)
        outputs = []
        for request_id in self._order[:self.max_num_seqs]:
            outputs.append(self._next_token(self._requests[request_id]))
        for out in outputs:
            if out.finished:
                self.abort(out.request_id)
        return outputs

    def _next_token(self, r: _Request) -> RequestOutput:
        p = r.params
        wants_eos = "[eos]" in self.tokenizer.decode(r.prompt) and r.generated == 5 and not p.ignore_eos
        token = self._eos if wants_eos else self._script[(r.offset + r.generated) % len(self._script)]
        if r.reply is not None:
            token = r.reply[r.generated] if r.generated < len(r.reply) else self._eos
        r.generated += 1
        self._generated_total += 1
        reason = "stop" if token == self._eos or token in p.stop_token_ids else \
            "length" if r.generated >= p.max_tokens else None
        logprobs = top = None
        if p.logprobs is not None:
            logprobs = [-0.25]
            top = [[(token, -0.25), ((token + 1) % 256, -2.0), ((token + 2) % 256, -3.0)][:p.logprobs]]
        return RequestOutput(r.request_id, [token], logprobs, top, reason is not None, reason,
                             len(r.prompt), r.generated)

    def stats(self) -> dict:
        used = sum(math.ceil((len(r.prompt) + r.generated) / self.page_size)
                   for r in self._requests.values())
        running = min(len(self._order), self.max_num_seqs)
        return {"running": running, "waiting": len(self._order) - running,
                "kv_pages_total": self.num_kv_pages, "kv_pages_used": used,
                "kv_usage": used / self.num_kv_pages, "prefix_hit_rate": 0.0,
                "prefix_hit_tokens": 0, "prefix_query_tokens": 0, "retractions": 0,
                "num_generated_tokens": self._generated_total}


# --- launching a real server subprocess (shared by the server test modules) ---------------

REPO = Path(__file__).resolve().parents[2]
FAKE = ["--engine", "tests.serve.fake_engine:FakeEngine"]
# The real Engine with random weights in a tiny Llama shape: fast on CPU, and its vocab matches
# the SmolLM2 tokenizer that dummy models use, so any text prompt is valid.
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 49152, "rms_norm_eps": 1e-5,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
              "max_position_embeddings": 4096, "tie_word_embeddings": True}


def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny-llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return f"dummy:{path}"


class ServerProcess:
    """`python -m serve ARGS --port 0` in its own session; waits for the printed URL."""

    def __init__(self, *args: str, ready_timeout: float = 600.0):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="serve-test-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "serve", *args, "--port", "0"],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, start_new_session=True)
        self.url = self._wait_url(ready_timeout)
        self.base_url = self.url + "/v1"
        self.engine_pid = int(re.search(r"engine process pid=(\d+)", self.logs()).group(1))

    def _wait_url(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = self.proc.stdout.readline()
                m = re.search(r"(http://\S+?)/v1", line)
                if m:
                    return m.group(1)
                if not line:
                    break
        self.kill()
        raise RuntimeError(f"server did not start (exit {self.proc.poll()}):\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        return Path(self.log.name).read_text()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        os.unlink(self.log.name)
        return self.proc.returncode
