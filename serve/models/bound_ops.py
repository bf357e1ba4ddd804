"""The tskernels ops the models call, with the registry's choice bound once on the CPU.

Which backends run is the engine's kernel policy (`tskernels.KernelPolicy`, entered by the model
runner with `tskernels.use_backend(policy)`); this module holds no backend choice of its own
but FUSED_BACKEND, the name the opt-in fused decode gemvs are called by while unverified.

On a GPU these are the public ops as they are (decode steps replay CUDA graphs, where per-call
validation and selection cost nothing). On the CPU a decode step makes ~300 op calls and the
public ops' per-call validation + selection (~10-20 us each) is a visible share of the step, so
each op asks the registry once per (dtypes, traits) for the kernel the public op would select,
describing the problem exactly as the public op does, then calls it with the public op's
calling convention. The models' shapes are validated once by the parity tests instead.
"""
from __future__ import annotations

import torch

import tskernels
from tskernels import fmt

_bound: dict[tuple, object] = {}

# Decode fusion (rows <= 16 on a GPU, 16-bit weights): RMSNorm into the qkv / gate-up gemvs
# (gemm.rmsnorm_gemv), SiLU-mul into the down gemv (gemm.silu_mul_gemv), the o / down residual
# adds into their epilogues (serve.models.layers.DecoderLayer). Off until its GPU tier and the
# serving A/B ran (benchmarks/s15_gemv_gpu.py); turning it on by default is this line.
FUSE_DECODE_GEMV = False
# SiLU-mul (and the residual add) alone fused into the down gemv, norms and the other gemvs
# unfused: the one fused form that was faster than its unfused pair in session 15 (down 30.9 vs
# 32.7 us); off until a serving A/B with the chained launches shows it (session 17 lab run)
FUSE_SILU_DOWN = False
# the most rows that take the fused form (lower it if the lab script's M = 16 rows lose to
# the unfused pair)
FUSE_DECODE_MAX_M = 16
# a softmax-routed MoE block's post-attention (add +) RMSNorm, router gemv and top-k routing
# as one launch (moe.rmsnorm_router_topk_softmax) at decode sizes (serve.models.layers
# DecoderLayer / SoftmaxMoE.fused_route)
FUSE_MOE_ROUTER = False
FUSE_MOE_ROUTER_MAX_M = 64
# the fused kernels are named while they are not run-verified (the registry would pick the
# reference for them); None once verified.json lists them (the registry's choice)
FUSED_BACKEND: str | None = "triton"
# attention.rope_store_kv (decode steps: serve.forward_batch.FUSED_ROPE_STORE): the registry's
# choice (run-verified on the H200, session 17); a backend name here forces one
ROPE_STORE_BACKEND: str | None = None
# bf16 only: the fused RMSNorm rounds x * norm_weight (before rstd) to the operand dtype,
# which in fp16 can overflow on a large residual stream where the normed x would not
_FUSED_DTYPES = (torch.bfloat16,)


def bind(key: tuple, family: str, op: str, problem):
    """The kernel the registry selects for `family.op` on the CPU under the active kernel
    policy (`tskernels.use_backend(policy)`, entered by the model runner), bound once per
    (`key`, policy); `problem()` (formats / traits, as the public op describes them) is only
    built on a miss. Call it with the kernel's calling convention (the public op's arguments)."""
    policy = tskernels.active_policy()
    k = _bound.get((key, policy))
    if k is None:
        k = _bound[key, policy] = tskernels.select(family, op, device="cpu", **problem())
    return k


def _gemv_fits(a: torch.Tensor, b: torch.Tensor, out_dtype) -> bool:
    """Decode rows (M <= 16) on a GPU go to gemm.gemv when the registry, under the active
    policy, selects a real kernel for it there (the Triton weight-streaming kernel once
    run-verified, or one named by the policy / TSKERNELS_BACKEND); never to the reference,
    which upcasts the weight on every call."""
    c = out_dtype or a.dtype
    policy = tskernels.active_policy()
    key = ("gemv?", a.device, a.dtype, b.dtype, c)
    ok = _bound.get((key, policy))
    if ok is None:
        try:
            k = tskernels.select("gemm", "gemv", device=a.device,
                                 formats={"a": fmt(a.dtype), "b": fmt(b.dtype), "c": fmt(c)})
            ok = k.band != "reference"
        except tskernels.SelectionError:
            ok = False
        _bound[key, policy] = ok
    return ok


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None):
    """c = a @ b.T, a [M, K], b [N, K] (gemm.mm; gemm.gemv for decode rows on a GPU)."""
    if a.device.type != "cpu":
        if a.shape[0] <= tskernels.gemm.GEMV_MAX_M and _gemv_fits(a, b, out_dtype):
            return tskernels.gemm.gemv(a, b, out_dtype=out_dtype)
        return tskernels.gemm.mm(a, b, out_dtype=out_dtype)
    c = out_dtype or a.dtype
    k = bind(("mm", a.dtype, b.dtype, c), "gemm", "mm",
             lambda: dict(formats={"a": fmt(a.dtype), "b": fmt(b.dtype), "c": fmt(c)}))
    return k(a, b, out_dtype=out_dtype)


def fuse_decode(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a decoder layer runs its norms / activation fused into its gemvs for rows x
    (FUSE_DECODE_GEMV, a GPU, at most gemm.GEMV_MAX_M rows, bf16, gemm.gemv taken there)."""
    return (FUSE_DECODE_GEMV and x.device.type != "cpu" and x.dtype in _FUSED_DTYPES and
            x.shape[0] <= min(FUSE_DECODE_MAX_M, tskernels.gemm.GEMV_MAX_M) and
            _gemv_fits(x, w, None))


def fuse_silu_down(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether an MLP's SiLU-mul runs inside its down gemv for rows x (FUSE_SILU_DOWN alone;
    FUSE_DECODE_GEMV fuses more and takes precedence)."""
    return (FUSE_SILU_DOWN and x.device.type != "cpu" and x.dtype in _FUSED_DTYPES and
            x.shape[0] <= min(FUSE_DECODE_MAX_M, tskernels.gemm.GEMV_MAX_M) and
            _gemv_fits(x, w, None))


def fuse_moe_router(x: torch.Tensor, gate) -> bool:
    """Whether a softmax-routed MoE block takes its post-attention (add +) RMSNorm, router
    projection and routing as one op for rows x (FUSE_MOE_ROUTER, a GPU, at most
    FUSE_MOE_ROUTER_MAX_M rows, a plain router weight of x's dtype)."""
    return (FUSE_MOE_ROUTER and x.device.type != "cpu" and
            x.shape[0] <= FUSE_MOE_ROUTER_MAX_M and gate.plain() and
            gate.weight.dtype == x.dtype)


def rmsnorm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, w: torch.Tensor):
    """rmsnorm(x) @ w.T in one launch (x [M, K] the residual stream, w [N, K])."""
    return tskernels.gemm.rmsnorm_gemv(x, norm_weight, w, eps=eps, backend=FUSED_BACKEND)


def silu_mul_gemv(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor):
    """silu(gate) * up @ w.T + residual in one launch (x [M, 2I] the gate|up output)."""
    return tskernels.gemm.silu_mul_gemv(x, w, residual=residual, backend=FUSED_BACKEND)


def gemv_residual(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor):
    """x @ w.T + residual, the add in the gemv's epilogue (one rounding)."""
    return tskernels.gemm.gemv(x, w, residual=residual)


def _norm_problem(x: torch.Tensor, weight: torch.Tensor) -> dict:
    return dict(formats={"x": fmt(x.dtype), "weight": fmt(weight.dtype)},
                traits={"hidden": x.shape[-1]})


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float):
    if x.device.type != "cpu":
        return tskernels.norm.rmsnorm(x, weight, eps)
    k = bind(("rmsnorm", x.dtype, weight.dtype, x.shape[-1]), "norm", "rmsnorm",
             lambda: _norm_problem(x, weight))
    return k(x, weight, eps, out=None)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    if x.device.type != "cpu":
        return tskernels.norm.fused_add_rmsnorm(x, residual, weight, eps)
    k = bind(("fused_add_rmsnorm", x.dtype, weight.dtype, x.shape[-1]), "norm",
             "fused_add_rmsnorm", lambda: _norm_problem(x, weight))
    return k(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor):
    if x.device.type != "cpu":
        return tskernels.activation.silu_and_mul(x)
    k = bind(("silu_and_mul", x.dtype), "activation", "silu_and_mul",
             lambda: dict(formats={"x": fmt(x.dtype)}))
    return k(x, out=None)


def gelu_tanh_and_mul(x: torch.Tensor):
    if x.device.type != "cpu":
        return tskernels.activation.gelu_tanh_and_mul(x)
    k = bind(("gelu_tanh_and_mul", x.dtype), "activation", "gelu_tanh_and_mul",
             lambda: dict(formats={"x": fmt(x.dtype)}))
    return k(x, out=None)


def apply_rope(q, k, positions, cos_sin_cache, *, style: str):
    if q.device.type != "cpu":
        return tskernels.rope.apply_rope(q, k, positions, cos_sin_cache, style=style)
    kern = bind(("apply_rope", q.dtype, style), "rope", "apply_rope",
                lambda: dict(formats={"q": fmt(q.dtype)}, traits={"style": style}))
    return kern(q, k, positions, cos_sin_cache, style=style, inplace=False)


def rope_store_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, *,
                  style: str, q_norm_weight=None, k_norm_weight=None, eps: float = 1e-6):
    """q/k norm + RoPE + K/V store in one launch (decode steps on a GPU); returns q_out."""
    return tskernels.attention.rope_store_kv(
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, style=style,
        q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, eps=eps,
        backend=ROPE_STORE_BACKEND)
