"""Tuning spaces of the Triton gated-delta-rule kernels (see autotune.declare):

- `gdn.decode_step.triton`: value columns per program (`block_v`) and warps;
- `gdn.chunk_prefill.triton`: the state kernel's value block and the WY / output kernels'
  warps (the kernel's own `tuning` overrides).

A value 0 means "the kernel's own choice" (`_block_v`, 4 warps; the chunk kernels' defaults),
and the heuristic is all zeros, so without a table entry a launch is what it was, including
when the kernel's defaults change. Checks compare outputs and states with the activations'
tolerance (as the kernels' tests do).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autotune import KernelSpace, Runner, Space, declare, jit_source, pow2_bucket

from ... import tuning
from ...numerics import tolerance

HK, HV, DK, DV = 16, 32, 128, 128   # Qwen3-Next's linear-attention heads (the bench shapes)
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _fmt(dtype) -> str:
    return {torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, "bf16")


def _dtype(p, device) -> torch.dtype:
    dt = _DT.get(p.get("dtype", "bf16"), torch.bfloat16)
    return torch.float16 if dt == torch.bfloat16 and torch.device(device).type != "cuda" else dt


def _close(outs, refs, dtype) -> bool:
    tol = tolerance(dtype)
    for o, r in zip(outs, refs):
        rms, mx = tuning._rel_errors(o, r)
        if not (rms <= tol.rel_rms and mx <= tol.rel_max):
            return False
    return True


def nonzero(cfg) -> dict:
    """The config without its "kernel's own choice" (0) entries."""
    return {k: v for k, v in cfg.items() if v}


# ---- decode_step -----------------------------------------------------------------------------
class _DecodeRunner(Runner):
    def __init__(self, p, device):
        from .triton_decode import decode_step
        B, hk, hv, dk, dv = p["B"], p["HK"], p["HV"], p["K"], p["V"]
        dt = _dtype(p, device)
        self.dt = dt
        self.q = torch.randn(B, hk, dk, device=device, dtype=dt)
        self.k = F.normalize(torch.randn(B, hk, dk, device=device), dim=-1).to(dt)
        self.v = torch.randn(B, hv, dv, device=device, dtype=dt)
        self.g = F.logsigmoid(torch.randn(B, hv, device=device) + 2)
        self.beta = torch.rand(B, hv, device=device)
        self.state0 = torch.randn(B + 1, hv, dk, dv, device=device) * 0.1
        self.slots = torch.randperm(B + 1, device=device)[:B].to(torch.int32)
        self.state = self.state0.clone()
        self.fn = decode_step

    def _run(self, cfg, state):
        tuned = nonzero(cfg)
        with _forced(tuned):
            return self.fn(self.q, self.k, self.v, self.g, self.beta, state, self.slots,
                           use_qk_l2norm=False)

    def build(self, cfg):
        return lambda: self._run(cfg, self.state)

    def check(self, cfg) -> bool:
        from tskernels_ref.gdn import decode_step as ref
        state = self.state0.clone()
        o = self._run(cfg, state)
        want_state = self.state0.double()
        want = ref(self.q.double(), self.k.double(), self.v.double(), self.g.double(),
                   self.beta.double(), want_state, self.slots)
        return _close((o, state), (want, want_state), self.dt)


_force = {}


class _forced:
    """Run a launch with a forced config (the tuner's runners)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        _force["cfg"] = self.cfg

    def __exit__(self, *exc):
        _force.pop("cfg", None)


def _decode_prune(cfg, p, target) -> str | None:
    if cfg["block_v"] and (cfg["block_v"] > p["V"] or p["V"] % cfg["block_v"]):
        return "block_v must divide the value head size"
    if cfg["block_v"] and cfg["num_warps"] and \
            cfg["num_warps"] * target.warp_size > cfg["block_v"] * p["K"] // 4:
        return "fewer than 4 state elements per thread"
    return None


def _decode_source():
    from .triton_decode import _decode_kernel
    return jit_source(_decode_kernel)


DECODE = declare(KernelSpace(
    "gdn.decode_step.triton", Space(block_v=[0, 16, 32, 64], num_warps=[0, 2, 8]),
    key=lambda p: {"B": pow2_bucket(p["B"]), "HK": p["HK"], "HV": p["HV"], "K": p["K"],
                   "V": p["V"], "dtype": p.get("dtype", "bf16")},
    heuristic=lambda p: {"block_v": 0, "num_warps": 0}, prune=_decode_prune,
    source=_decode_source, runner=_DecodeRunner, parse=tuning.parse_shape,
    exact=("HK", "HV", "K", "V"),
    # small (the CPU tier runs its runner under the interpreter); the bench shapes are below
    example={"B": 4, "HK": 2, "HV": 4, "K": 64, "V": 64, "dtype": "bf16"},
    shapes=tuple({"B": b, "HK": HK, "HV": HV, "K": DK, "V": DV, "dtype": "bf16"}
                 for b in (1, 64, 256))))


def decode_config(batch, hk, hv, dk, dv, dtype, device) -> dict:
    """{"block_v", "num_warps"} overrides (empty: the kernel's own choices)."""
    if "cfg" in _force:
        return _force["cfg"]
    if device.type != "cuda":
        return {}
    return nonzero(tuning.config(DECODE, {"B": batch, "HK": hk, "HV": hv, "K": dk, "V": dv,
                                          "dtype": _fmt(dtype)}, device))


# ---- chunk_prefill ---------------------------------------------------------------------------
class _ChunkRunner(Runner):
    def __init__(self, p, device):
        from .triton_chunk import chunk_prefill
        T, N, hk, hv, dk, dv = p["T"], p["N"], p["HK"], p["HV"], p["K"], p["V"]
        dt = _dtype(p, device)
        self.dt, self.fn = dt, chunk_prefill
        self.q = torch.randn(T, hk, dk, device=device, dtype=dt)
        self.k = F.normalize(torch.randn(T, hk, dk, device=device), dim=-1).to(dt)
        self.v = torch.randn(T, hv, dv, device=device, dtype=dt)
        self.g = F.logsigmoid(torch.randn(T, hv, device=device) + 2)
        self.beta = torch.rand(T, hv, device=device)
        self.cu = torch.linspace(0, T, N + 1, device=device).round().to(torch.int32)

    def _run(self, cfg):
        with _forced(nonzero(cfg)):        # {}: the kernels' defaults, not a table's entry
            return self.fn(self.q, self.k, self.v, self.g, self.beta, cu_seqlens=self.cu)

    def build(self, cfg):
        return lambda: self._run(cfg)

    def check(self, cfg) -> bool:
        from tskernels_ref.gdn import chunk_prefill as ref
        o, s = self._run(cfg)
        ro, rs = ref(self.q.double(), self.k.double(), self.v.double(), self.g.double(),
                     self.beta.double(), cu_seqlens=self.cu)
        return _close((o, s), (ro, rs), self.dt)


def _chunk_prune(cfg, p, target) -> str | None:
    if cfg["state_bv"] and (cfg["state_bv"] > p["V"] or p["V"] % cfg["state_bv"]):
        return "state_bv must divide the value head size"
    return None


def _chunk_source():
    from . import triton_chunk as tc
    return "\n".join(jit_source(f) for f in (tc._wy_kernel, tc._wy_solve_kernel,
                                              tc._wy_apply_kernel, tc._state_kernel,
                                              tc._output_kernel))


CHUNK = declare(KernelSpace(
    "gdn.chunk_prefill.triton",
    Space(state_bv=[0, 16, 32, 64], wy_warps=[0, 4, 8], out_warps=[0, 4, 8]),
    key=lambda p: {"T": pow2_bucket(p["T"]), "N": pow2_bucket(p["N"]), "HK": p["HK"],
                   "HV": p["HV"], "K": p["K"], "V": p["V"], "dtype": p.get("dtype", "bf16")},
    heuristic=lambda p: {"state_bv": 0, "wy_warps": 0, "out_warps": 0}, prune=_chunk_prune,
    source=_chunk_source, runner=_ChunkRunner, parse=tuning.parse_shape,
    exact=("HK", "HV", "K", "V"),
    example={"T": 64, "N": 1, "HK": 1, "HV": 2, "K": 64, "V": 64, "dtype": "bf16"},
    shapes=tuple({"T": t, "N": 1, "HK": HK, "HV": HV, "K": DK, "V": DV, "dtype": "bf16"}
                 for t in (4096, 16384))))


def chunk_config(total, num_seqs, hk, hv, dk, dv, dtype, device) -> dict:
    """The chunk kernels' overrides (empty: their own choices)."""
    if "cfg" in _force:
        return _force["cfg"]
    if device.type != "cuda":
        return {}
    return nonzero(tuning.config(CHUNK, {"T": total, "N": num_seqs, "HK": hk, "HV": hv,
                                         "K": dk, "V": dv, "dtype": _fmt(dtype)}, device))
