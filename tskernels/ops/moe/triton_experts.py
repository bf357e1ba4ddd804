"""Triton fused experts and combine: routing ids -> align -> gate-up(+SiLU-mul) -> down(*w)
-> combine, four launches after routing (one align launch for decode sizes).

Tile shapes come from a table keyed by the token count T (a fixed choice per T, so a captured
decode graph keeps its kernels); decode rows (T <= 16) use 16-row blocks and narrow N tiles so
that ~200 programs stream the touched experts' weights, prefill uses 128-row wgmma tiles.
Up to triton_direct.MAX_TOKENS tokens with 16-bit weights skip align and combine: two launches
indexed by the routing slots (triton_direct; H200 layer at T = 1: 30.2 vs 41.5 us).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from ...compile import CompileCase
from ...registry import register
from .._common import TRITON
from . import _tune
from . import triton_direct
from .triton_align import align
from .triton_gemm import combine_kernel, down_kernel, gate_up_kernel

FP8_BLOCK = 128


@dataclass(frozen=True)
class Tiles:
    block_m: int
    up_n: int
    up_k: int
    down_n: int
    down_k: int
    group_m: int
    up_warps: int
    up_stages: int
    down_warps: int
    down_stages: int


# T upper bound -> tiles (bf16 / fp16 weights)
_TABLE = (
    (16, Tiles(16, 32, 128, 64, 128, 1, 4, 4, 4, 4)),
    (128, Tiles(16, 64, 128, 128, 128, 1, 4, 3, 4, 3)),
    (512, Tiles(32, 64, 128, 128, 128, 8, 4, 3, 4, 3)),
    (2048, Tiles(64, 128, 64, 128, 64, 8, 8, 4, 4, 4)),
    (1 << 62, Tiles(128, 128, 64, 256, 64, 8, 8, 3, 8, 4)),
)
# fp8 weights: K steps of one 128-wide scale group; gate-up N tile = one quantization group
_TABLE_FP8 = (
    (16, Tiles(16, 128, 128, 64, 128, 1, 8, 3, 4, 4)),
    (1 << 62, Tiles(64, 128, 128, 128, 128, 8, 8, 3, 8, 3)),
)


# AMD CDNA (wave 64), per arch: heuristic, not run (no AMD GPU); the compile matrix shows MFMA,
# no scratch and LDS within the arch for each. The tables are the space's CDNA heuristic; the
# knobs (CDNA_OPTIONS, the space's AMD defaults) are passed at launch on AMD only.
def _cdna(t: Tiles, **kw) -> Tiles:
    # 2 stages: gfx942 does not stage the gathered rows in LDS (16-32 KB at 2-4 stages alike),
    # and on gfx950 the 3-4 stage prefill tiles take 98-147 KB of the 160 KB: one workgroup
    # per CU where 2 stages (48 KB) leave room for three
    return dataclasses.replace(t, up_stages=2, down_stages=2, **kw)


CDNA_TABLES = {
    arch: (tuple((b, _cdna(t)) for b, t in _TABLE),
           # fp8 prefill gate-up (two block-rescaled accumulators): 8 waves are capped at 256
           # VGPRs and spilled 32 B on gfx950, 4 waves take 408 without scratch
           tuple((b, _cdna(t, up_warps=4) if t.block_m >= 64 else _cdna(t))
                 for b, t in _TABLE_FP8))
    for arch in ("gfx942", "gfx950")}
# 16x16 MFMA: decode blocks are 16 rows, one MFMA row block (32x32 would half-fill them)
CDNA_OPTIONS = {"matrix_instr_nonkdim": 16}
_arch: dict[torch.device, str | None] = {}


def cdna_arch(device: torch.device) -> str | None:
    """"gfx942" / "gfx950" on those AMD devices, else None."""
    if device.type != "cuda" or torch.version.hip is None:
        return None
    if device not in _arch:
        from ...platform import platform_of
        arch = platform_of(device).arch
        _arch[device] = arch if arch in CDNA_TABLES else None
    return _arch[device]


def tiles_for(tokens: int, fp8: bool, arch: str | None = None) -> Tiles:
    """The table's tiles for `tokens` (arch: a CDNA arch's own table)."""
    table = (_TABLE_FP8 if fp8 else _TABLE) if arch is None else CDNA_TABLES[arch][fp8]
    for bound, t in table:
        if tokens <= bound:
            return t
    raise AssertionError("unreachable")


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def experts(x, w13, w2, topk_weights, topk_ids, *, activation="silu", w13_scale=None,
            w2_scale=None, tiles: Tiles | None = None) -> torch.Tensor:
    """The fused-experts layer (see `tskernels.moe.fused_experts`). Up to
    `triton_direct.MAX_TOKENS` tokens with 16-bit weights take the align-free path (unless
    `tiles` names aligned-path tiles)."""
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    fp8 = w13.dtype == torch.float8_e4m3fn
    if not fp8 and tiles is None and 0 < tokens <= triton_direct.MAX_TOKENS:
        return triton_direct.direct_experts(_contig(x), _contig(w13), _contig(w2),
                                            topk_weights, topk_ids, activation=activation)
    dev = x.device
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=dev)
    if tokens == 0:
        return out
    if tiles is None:
        cfg, opts = _tune.launch(tokens, hidden, inter, num_experts, top_k, fp8, dev)
    else:
        cfg, opts = tiles, (CDNA_OPTIONS if cdna_arch(dev) is not None else {})
    numel = tokens * top_k
    sorted_ids, expert_ids, total = align(topk_ids, num_experts, cfg.block_m)
    max_padded = sorted_ids.numel()
    num_m = expert_ids.numel()
    x, w13, w2 = _contig(x), _contig(w13), _contig(w2)
    weights = _contig(topk_weights.float())
    act_dtype = torch.float8_e4m3fn if fp8 else x.dtype
    act = torch.empty(max_padded, inter, dtype=act_dtype, device=dev)
    y = torch.empty(numel, hidden, dtype=x.dtype, device=dev)
    if fp8:
        from ..gemm import quantize_fp8_per_token_group  # the public op (its kernel policy)
        xq, xs = quantize_fp8_per_token_group(x, FP8_BLOCK)
        xs = _contig(xs)
        w13s, w2s = _contig(w13_scale.float()), _contig(w2_scale.float())
        acts = torch.empty(max_padded, inter // FP8_BLOCK, dtype=torch.float32, device=dev)
        scale_args = (xs.stride(0), w13s.stride(0), w13s.stride(1), acts.stride(0))
    else:
        xq, xs, w13s, w2s, acts = x, x, x, x, x
        scale_args = (0, 0, 0, 0)
    gate_up_kernel[(num_m * triton.cdiv(inter, cfg.up_n),)](
        xq, w13, act, xs, w13s, acts, sorted_ids, expert_ids, total, numel, num_m, inter,
        hidden, xq.stride(0), w13.stride(0), w13.stride(1), act.stride(0), *scale_args,
        TOP_K=top_k, FP8=fp8, GELU=activation == "gelu", BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.up_n, BLOCK_K=cfg.up_k, GROUP_M=cfg.group_m, num_warps=cfg.up_warps,
        num_stages=cfg.up_stages, **opts)
    down_kernel[(num_m * triton.cdiv(hidden, cfg.down_n),)](
        act, w2, y, acts, w2s, weights, sorted_ids, expert_ids, total, numel, num_m, hidden,
        inter, act.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        acts.stride(0) if fp8 else 0, w2s.stride(0) if fp8 else 0, w2s.stride(1) if fp8 else 0,
        FP8=fp8, BLOCK_M=cfg.block_m, BLOCK_N=cfg.down_n, BLOCK_K=cfg.down_k,
        GROUP_M=cfg.group_m, num_warps=cfg.down_warps, num_stages=cfg.down_stages, **opts)
    # rows of y whose id is not a local expert were never written: the combine skips them
    _combine(y.view(tokens, top_k, hidden), None, out, ids=_contig(topk_ids),
             num_experts=num_experts)
    return out


def _combine(y: torch.Tensor, weights: torch.Tensor | None, out: torch.Tensor, *,
             ids: torch.Tensor | None = None, num_experts: int = 0) -> torch.Tensor:
    tokens, top_k, hidden = y.shape
    if tokens == 0 or hidden == 0:
        return out
    if y.stride(2) != 1:
        y = y.contiguous()
    block_h = min(1024, triton.next_power_of_2(hidden))
    combine_kernel[(tokens, triton.cdiv(hidden, block_h))](
        y, weights if weights is not None else y, ids if ids is not None else y, out, hidden,
        num_experts, y.stride(0), y.stride(1), out.stride(0), K=top_k,
        K_P=triton.next_power_of_2(top_k), HAS_W=weights is not None, HAS_IDS=ids is not None,
        BLOCK_H=block_h, num_warps=4)
    return out


def _cases():
    up_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "act_ptr": "*bf16", "xs_ptr": "*bf16",
              "ws_ptr": "*bf16", "acts_ptr": "*bf16", "sorted_ptr": "*i32", "expert_ptr": "*i32",
              "total_ptr": "*i32", "numel": "i32", "num_m": "i32", "I": "i32", "H": "i32",
              "stride_xt": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_ar": "i32",
              "stride_xst": "i32", "stride_wse": "i32", "stride_wsn": "i32",
              "stride_asr": "i32"}
    up_fp8 = {**up_sig, "x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "act_ptr": "*fp8e4nv",
              "xs_ptr": "*fp32", "ws_ptr": "*fp32", "acts_ptr": "*fp32"}
    dn_sig = {"a_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "as_ptr": "*bf16",
              "ws_ptr": "*bf16", "topk_w_ptr": "*fp32", "sorted_ptr": "*i32",
              "expert_ptr": "*i32", "total_ptr": "*i32", "numel": "i32", "num_m": "i32",
              "H": "i32", "I": "i32", "stride_ar": "i32", "stride_we": "i32",
              "stride_wn": "i32", "stride_yf": "i32", "stride_asr": "i32",
              "stride_wse": "i32", "stride_wsn": "i32"}
    dn_fp8 = {**dn_sig, "a_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "as_ptr": "*fp32",
              "ws_ptr": "*fp32"}
    up_al = ("stride_xt", "stride_we", "stride_wn", "stride_ar")
    dn_al = ("stride_ar", "stride_we", "stride_wn", "stride_yf")
    cases = []
    _aligned_cases(cases, up_sig, up_fp8, dn_sig, dn_fp8, up_al, dn_al, None)
    nvidia = tuple(t for t in TRITON["compiled"] if t.startswith("sm_"))
    cases = [dataclasses.replace(c, targets=tuple(t for t in (c.targets or nvidia)
                                                  if t in nvidia)) for c in cases]
    for arch in CDNA_TABLES:  # the CDNA tables, with their launch knobs
        _aligned_cases(cases, up_sig, up_fp8, dn_sig, dn_fp8, up_al, dn_al, arch)
    return cases + triton_direct.compile_cases()


def _aligned_cases(cases, up_sig, up_fp8, dn_sig, dn_fp8, up_al, dn_al, arch):
    """The aligned path's gate-up / down cases at prefill and decode tiles (arch: a CDNA
    table, built for that arch only, fp8 where its MFMA takes e4m3: gfx950)."""
    sfx, only = (f"_{arch}", (arch,)) if arch else ("", None)
    opts = tuple(CDNA_OPTIONS.items()) if arch else ()
    for label, t in (("prefill", tiles_for(8192, False, arch)),
                     ("decode", tiles_for(1, False, arch))):
        label += sfx
        narrow = t.block_m < 64
        cases.append(CompileCase(
            gate_up_kernel, up_sig, dict(TOP_K=8, FP8=False, GELU=False, BLOCK_M=t.block_m,
                                         BLOCK_N=t.up_n, BLOCK_K=t.up_k, GROUP_M=t.group_m),
            num_warps=t.up_warps, num_stages=t.up_stages, uses_dot=True, label=label,
            aligned=up_al, narrow_dot=narrow, targets=only, options=opts))
        cases.append(CompileCase(
            down_kernel, dn_sig, dict(FP8=False, BLOCK_M=t.block_m, BLOCK_N=t.down_n,
                                      BLOCK_K=t.down_k, GROUP_M=t.group_m),
            num_warps=t.down_warps, num_stages=t.down_stages, uses_dot=True, label=label,
            aligned=dn_al, narrow_dot=narrow, targets=only, options=opts))
    # e4m3 tensor cores: sm_90 / sm_120 / gfx950. sm_100 is left out: its tcgen05 build of
    # the fp8 gate-up (two block-rescaled accumulators) spills ~4.9 KB at these tiles.
    fp8_targets = ("sm_90", "sm_120", "gfx950") if arch is None else \
        (only if arch == "gfx950" else ())
    if not fp8_targets:
        return
    for label, t in (("fp8_prefill", tiles_for(8192, True, arch)),
                     ("fp8_decode", tiles_for(1, True, arch))):
        label += sfx
        narrow = t.block_m < 64
        cases.append(CompileCase(
            gate_up_kernel, up_fp8, dict(TOP_K=8, FP8=True, GELU=False, BLOCK_M=t.block_m,
                                         BLOCK_N=t.up_n, BLOCK_K=t.up_k, GROUP_M=t.group_m),
            num_warps=t.up_warps, num_stages=t.up_stages, uses_dot=True, label=label,
            aligned=up_al, targets=fp8_targets, narrow_dot=narrow, options=opts))
        cases.append(CompileCase(
            down_kernel, dn_fp8, dict(FP8=True, BLOCK_M=t.block_m, BLOCK_N=t.down_n,
                                      BLOCK_K=t.down_k, GROUP_M=t.group_m),
            num_warps=t.down_warps, num_stages=t.down_stages, uses_dot=True, label=label,
            aligned=dn_al, targets=fp8_targets, narrow_dot=narrow, options=opts))


def _combine_cases():
    return [CompileCase(
        combine_kernel, {"y_ptr": "*bf16", "w_ptr": "*fp32", "id_ptr": "*i32",
                         "out_ptr": "*bf16", "H": "i32", "E": "i32", "stride_yt": "i32",
                         "stride_yk": "i32", "stride_ot": "i32"},
        dict(K=8, K_P=8, HAS_W=True, HAS_IDS=False, BLOCK_H=1024),
        aligned=("stride_yt", "stride_yk", "stride_ot"))]


@register("moe", "fused_experts", **TRITON,
          formats={"x": ("fp16", "bf16"), "w": ("fp16", "bf16", "fp8_e4m3")},
          traits={"activation": ("silu", "gelu"), "weight_block": (None, FP8_BLOCK)},
          tags=("deterministic",), compile_cases=_cases)
def fused_experts(x, w13, w2, topk_weights, topk_ids, *, activation, w13_scale=None,
                  w2_scale=None):
    """Triton fused experts: align + gate-up/SiLU-mul + down/weight + combine (bf16, fp16, or
    block-fp8 weights); decode-sized T with 16-bit weights: per-slot gate-up and a per-token
    down that sums the slots (no align, no combine launch)."""
    return experts(x, w13, w2, topk_weights, topk_ids, activation=activation,
                   w13_scale=w13_scale, w2_scale=w2_scale)


@register("moe", "combine", **TRITON, formats={"expert_out": ("fp32", "fp16", "bf16")},
          tags=("deterministic",), compile_cases=_combine_cases)
def combine(expert_out, topk_weights):
    """Triton weighted combine (one program per token and 1024 hidden columns)."""
    out = torch.empty(expert_out.shape[0], expert_out.shape[2], dtype=expert_out.dtype,
                      device=expert_out.device)
    return _combine(expert_out, _contig(topk_weights.float()), out)
