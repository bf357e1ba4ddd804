"""llama.cpp as a side of the CPU serving benchmark (benchmarks/serve_cpu_bench.py): greedy
generation of B sequences at once through llama.cpp's C API (llama_batch with one sequence id
per request, as llama.cpp's own batched examples do), on the GGUF file itself.

The C API is reached through llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`, the
low-level module; its high-level `Llama` class has no multi-sequence batch). The library can be
the one a `pip install llama-cpp-python` built, or one built from the same sdist's vendored
llama.cpp with CMake, library target only (minutes instead of the wheel build's ~40+ on two
loaded cores), pointed to by LLAMA_CPP_LIB_PATH:

    bash benchmarks/cpu_llamacpp_build.sh /tmp/llamacpp      # prints the two exports to use

Each call clears the KV cache, prefills the B prompts in one llama_decode (one logits row per
sequence), then decodes B tokens per step; the next token is the argmax of the logits with EOS
masked, so every sequence generates exactly n tokens, as the engine (ignore_eos) and HF
(min_new_tokens) do. Sampling is a numpy argmax over the vocabulary per sequence (~20 us).
"""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np


class LlamaCppBatched:
    """One llama.cpp model + context for up to `max_batch` sequences of `max_len` tokens.

    run(ids, b, n) -> seconds for B = b copies of prompt `ids` (list[int] of the model's
    tokenizer: the GGUF's vocabulary is the same SmolLM2 BPE) generating n tokens each.
    """

    def __init__(self, gguf: str, threads: int, max_batch: int = 8, max_len: int = 512):
        import llama_cpp.llama_cpp as L  # ctypes bindings; loads libllama (LLAMA_CPP_LIB_PATH)

        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(os.fsencode(gguf), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        cp = L.llama_context_default_params()
        cp.n_ctx = max_batch * max_len
        cp.n_batch = cp.n_ubatch = max_len
        cp.n_seq_max = max_batch
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(vocab)
        self.eos = L.llama_vocab_eos(vocab)
        self.max_batch, self.max_len = max_batch, max_len
        self.batch = L.llama_batch_init(max_len, 0, 1)
        self.system_info = L.llama_print_system_info().decode(errors="replace")

    def _fill(self, items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, position, sequence id, wants logits)."""
        bt = self.batch
        for i, (tok, pos, seq, out) in enumerate(items):
            bt.token[i] = tok
            bt.pos[i] = pos
            bt.n_seq_id[i] = 1
            bt.seq_id[i][0] = seq
            bt.logits[i] = out
        bt.n_tokens = len(items)
        rc = self.L.llama_decode(self.ctx, bt)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                    shape=(self.n_vocab,))
        eos_logit = row[self.eos]
        row[self.eos] = -np.inf  # a benchmark of n tokens: EOS never ends a sequence
        tok = int(row.argmax())
        row[self.eos] = eos_logit
        return tok

    def run(self, ids: list[int], b: int, n: int) -> float:
        if not 1 <= b <= self.max_batch or b * len(ids) > self.max_len \
                or len(ids) + n > self.max_len:
            raise ValueError(f"batch {b} x ({len(ids)} + {n}) tokens exceeds the context "
                             f"({self.max_batch} x {self.max_len})")
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        t = time.perf_counter()
        p = len(ids)
        self._fill([(tok, i, s, i == p - 1) for s in range(b) for i, tok in enumerate(ids)])
        nxt = [self._argmax(s * p + p - 1) for s in range(b)]
        for step in range(1, n):
            self._fill([(nxt[s], p + step - 1, s, True) for s in range(b)])
            nxt = [self._argmax(s) for s in range(b)]
        return time.perf_counter() - t

    def close(self) -> None:
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
