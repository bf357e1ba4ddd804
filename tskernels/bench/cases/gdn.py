"""Benchmarks of the gdn family on Qwen3-Next-80B-A3B's GDN shapes (16 key heads, 32 value
heads, head dims 128, fp32 state, bf16 activations, q / k L2 norm on): ours (Triton, named) vs
the PyTorch reference and, where the `fla` package (flash-linear-attention / fla-core) is
installed, its Triton kernels, timed in the same run."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tskernels
import tskernels_ref.gdn as ref

from ..core import Bench, register_bench

HK, HV, DK, DV = 16, 32, 128, 128
CHUNK = 64
DTYPE = torch.bfloat16
CONV_DIM, CONV_WIDTH = 2 * HK * DK + HV * DV, 4  # the conv runs over the q | k | v projection

PREFILL_SHAPES = [{"T": 4096, "N": 1}, {"T": 16384, "N": 1}, {"T": 65536, "N": 1},
                  {"T": 32768, "N": 8}]
DECODE_SHAPES = [{"B": 1}, {"B": 64}, {"B": 256}]


def _backend(d: dict) -> str | None:
    # ours is the Triton kernel, named (it is not auto-selected before run verification);
    # on a CPU the registry's choice (the reference) runs
    return "triton" if next(iter(d.values())).is_cuda else None


def _fla():
    try:
        from fla.ops.gated_delta_rule import (chunk_gated_delta_rule,
                                              fused_recurrent_gated_delta_rule)
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _acts(n, device, gen):
    rnd = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    return dict(q=rnd(n, HK, DK).to(DTYPE), k=rnd(n, HK, DK).to(DTYPE),
                v=rnd(n, HV, DV).to(DTYPE), g=F.logsigmoid(rnd(n, HV) + 3.0),
                beta=torch.sigmoid(rnd(n, HV)).to(DTYPE))


def _make_prefill(shape, device, gen):
    d = _acts(shape["T"], device, gen)
    per = shape["T"] // shape["N"]
    d["cu_seqlens"] = torch.arange(0, shape["T"] + 1, per, dtype=torch.int32, device=device)
    d["cu_long"] = d["cu_seqlens"].long()
    return d


def _prefill_flops(shape):
    # the chunked form's products per token and value head: K K^T, W, U, W H, K^T V', Q H,
    # Q K^T, (Q K^T) V' (dense chunk blocks counted, as FLA's papers do)
    c, k, v = CHUNK, DK, DV
    return 2 * shape["T"] * HV * (c * k + c * k + c * v + 3 * k * v + c * k + c * v)


def _prefill_bytes(shape):
    t = shape["T"]
    return t * (2 * HK * DK + 2 * HV * DV) * 2 + t * HV * 6 + shape["N"] * HV * DK * DV * 4


def _ours_prefill(d):
    return tskernels.gdn.chunk_prefill(d["q"], d["k"], d["v"], d["g"], d["beta"],
                                       cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True,
                                       backend=_backend(d))


def _ref_prefill(d):
    return ref.chunk_prefill(d["q"], d["k"], d["v"], d["g"], d["beta"],
                             cu_seqlens=d["cu_seqlens"], use_qk_l2norm=True)


def _fla_prefill(d):
    chunk, _ = _fla()
    varlen = d["cu_seqlens"].shape[0] > 2
    return chunk(d["q"][None], d["k"][None], d["v"][None], g=d["g"][None], beta=d["beta"][None],
                 output_final_state=True, use_qk_l2norm_in_kernel=True,
                 cu_seqlens=d["cu_long"] if varlen else None)


def _baselines(ours_ref, fla_fn):
    b = {"reference": ours_ref}
    if _fla() is not None:
        b["fla"] = fla_fn
    return b


register_bench(Bench(
    "gdn.chunk_prefill", PREFILL_SHAPES, _make_prefill, ours=_ours_prefill,
    baselines=_baselines(_ref_prefill, _fla_prefill), flops=_prefill_flops,
    bytes=_prefill_bytes, cpu_shapes=[{"T": 256, "N": 2}]))


def _make_decode(shape, device, gen):
    b = shape["B"]
    d = _acts(b, device, gen)
    d["state"] = torch.randn(b, HV, DK, DV, device=device, generator=gen) * 0.1
    d["slots"] = torch.randperm(b, device=device, generator=gen).to(torch.int32)
    return d


def _decode_bytes(shape):
    b = shape["B"]
    return 2 * b * HV * DK * DV * 4 + b * (2 * HK * DK + 2 * HV * DV) * 2 + b * HV * 6


def _ours_decode(d):
    return tskernels.gdn.decode_step(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"],
                                     d["slots"], use_qk_l2norm=True, backend=_backend(d))


def _ref_decode(d):
    return ref.decode_step(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["slots"],
                           use_qk_l2norm=True)


def _fla_decode(d):
    # FLA reads a dense [B, HV, K, V] initial state and writes a new final state: the same
    # state traffic as our in-place slot update (it has no slot indirection)
    _, recurrent = _fla()
    return recurrent(d["q"][:, None], d["k"][:, None], d["v"][:, None], g=d["g"][:, None],
                     beta=d["beta"][:, None], initial_state=d["state"], output_final_state=True,
                     use_qk_l2norm_in_kernel=True)


register_bench(Bench(
    "gdn.decode_step", DECODE_SHAPES, _make_decode, ours=_ours_decode,
    baselines=_baselines(_ref_decode, _fla_decode), bytes=_decode_bytes,
    cpu_shapes=[{"B": 4}]))


def _make_conv_update(shape, device, gen):
    b = shape["B"]
    return {"x": torch.randn(b, CONV_DIM, device=device, generator=gen).to(DTYPE),
            "w": torch.randn(CONV_DIM, CONV_WIDTH, device=device, generator=gen).to(DTYPE),
            "state": torch.randn(b, CONV_DIM, CONV_WIDTH - 1, device=device,
                                 generator=gen).to(DTYPE),
            "slots": torch.randperm(b, device=device, generator=gen).to(torch.int32)}


register_bench(Bench(
    "gdn.causal_conv1d_update", DECODE_SHAPES, _make_conv_update,
    ours=lambda d: tskernels.gdn.causal_conv1d_update(d["x"], d["state"], d["w"],
                                                      state_slots=d["slots"], backend=_backend(d)),
    baselines={"reference": lambda d: ref.causal_conv1d_update(d["x"], d["state"], d["w"],
                                                               state_slots=d["slots"])},
    bytes=lambda s: s["B"] * CONV_DIM * (2 * (CONV_WIDTH - 1) + 2) * 2,
    cpu_shapes=[{"B": 4}]))


def _make_conv(shape, device, gen):
    t = shape["T"]
    return {"x": torch.randn(t, CONV_DIM, device=device, generator=gen).to(DTYPE),
            "w": torch.randn(CONV_DIM, CONV_WIDTH, device=device, generator=gen).to(DTYPE),
            "cu_seqlens": torch.tensor([0, t], dtype=torch.int32, device=device)}


def _torch_conv(d):
    # a single sequence through torch's grouped conv1d (cuDNN), no state
    x = d["x"].T[None]
    y = F.conv1d(x, d["w"][:, None, :], padding=CONV_WIDTH - 1, groups=CONV_DIM)
    return F.silu(y[..., : x.shape[-1]])[0].T


register_bench(Bench(
    "gdn.causal_conv1d", [{"T": 4096}, {"T": 16384}], _make_conv,
    ours=lambda d: tskernels.gdn.causal_conv1d(d["x"], d["w"], cu_seqlens=d["cu_seqlens"],
                                               backend=_backend(d)),
    baselines={"torch_conv1d": _torch_conv},
    bytes=lambda s: 2 * s["T"] * CONV_DIM * 2, cpu_shapes=[{"T": 64}]))
