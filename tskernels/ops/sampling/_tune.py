"""Tuning space of the Triton greedy sampler's two-stage argmax, `sampling.greedy.triton`
(see autotune.declare): the chunk a program reduces, its load block and warps.

`chunk` 0 means the kernel's own rule (`triton._chunk`: tens of KB per program, the grid
covering every SM a few times), which with a 2048-wide block and 8 warps is the heuristic, so
without a table entry a launch is what it was.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

import torch

from autotune import KernelSpace, Runner, Space, declare, jit_source, pow2_bucket

from ... import tuning

_forced = threading.local()


@contextlib.contextmanager
def forced(cfg: dict):
    """Launch greedy argmax with `cfg` inside the block (the tuner's runner)."""
    prev = getattr(_forced, "cfg", None)
    _forced.cfg = cfg
    try:
        yield
    finally:
        _forced.cfg = prev


def _prune(cfg, p, target) -> str | None:
    if cfg["chunk"] and cfg["block"] > cfg["chunk"]:
        return "a load block wider than the chunk"
    if cfg["chunk"] and cfg["chunk"] > 2 * pow2_bucket(p["V"]):
        return "a chunk wider than the vocabulary"
    if cfg["num_warps"] * target.warp_size * 4 > cfg["block"]:
        return "fewer than 4 elements per thread and load"
    return None


class _GreedyRunner(Runner):
    """Rotates logits copies over ROTATE_BYTES; argmax must equal torch's exactly."""

    def __init__(self, p, device):
        from .triton import argmax
        B, V = p["B"], p["V"]
        dt = {"fp32": torch.float32, "fp16": torch.float16}.get(p.get("dtype"), torch.bfloat16)
        n = max(1, min(64, tuning.ROTATE_BYTES // (B * V * dt.itemsize)))
        self.inputs = [torch.randn(B, V, device=device).to(dt) for _ in range(n)]
        self.expected = torch.argmax(self.inputs[0].float(), dim=-1)
        self.argmax, self._i = argmax, 0

    def _run(self, cfg, x):
        with forced(cfg):
            return self.argmax(x, variant="two_stage")

    def build(self, cfg):
        def call():
            self._i = (self._i + 1) % len(self.inputs)
            return self._run(cfg, self.inputs[self._i])
        return call

    def check(self, cfg) -> bool:
        return bool(torch.equal(self._run(cfg, self.inputs[0]), self.expected))


def _source():
    from . import triton
    return jit_source(triton._argmax_chunk) + "\n" + jit_source(triton._argmax_final)


def _fmt(dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16"}.get(dtype, "bf16")


GREEDY = declare(KernelSpace(
    "sampling.greedy.triton",
    Space(chunk=[0, 2048, 4096, 8192, 16384], block=[1024, 2048, 4096], num_warps=[4, 8, 16]),
    key=lambda p: {"B": pow2_bucket(p["B"]), "V": pow2_bucket(p["V"]),
                   "dtype": p.get("dtype", "bf16")},
    heuristic=lambda p: {"chunk": 0, "block": 2048, "num_warps": 8}, prune=_prune,
    source=_source, runner=_GreedyRunner, parse=tuning.parse_shape,
    example={"B": 64, "V": 128256, "dtype": "bf16"},
    shapes=tuple({"B": b, "V": 128256, "dtype": dt} for b in (1, 64, 256)
                 for dt in ("bf16", "fp32"))))


def greedy_config(batch: int, vocab: int, dtype, device) -> Mapping:
    """The two-stage argmax config: forced (tuner), tuned on CUDA, else the heuristic."""
    cfg = getattr(_forced, "cfg", None)
    if cfg is not None:
        return cfg
    if device.type != "cuda":
        return GREEDY.heuristic({})
    return tuning.config(GREEDY, {"B": batch, "V": vocab, "dtype": _fmt(dtype)}, device)
