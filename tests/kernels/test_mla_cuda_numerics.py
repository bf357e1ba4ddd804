"""The CUDA MLA decode (tskernels/ops/mla/cuda/mla_decode_wgmma.cu) on the CPU tier: a float
model of exactly what the kernel computes, held to the dtype's tolerance against the float64
reference, plus its host-side pieces (split rule, registration, plan checks). The kernel itself
runs in the GPU tier (test_mla_cuda.py).

The model: per request and 64-head block, the request's rows in 64-row tiles (split over CTAs
by whole tiles: ceil(tiles / splits) each, merged by log-sum-exp); S = q . row in fp32 from
16-bit operands over all 576 columns; the tiles' softmax in turn (the two consumers alternate,
sharing one running max): m in base 2 (scale * log2 e folded into one constant), p = exp2(S c -
m) in fp32, its row sum unrounded into l, p rounded to q's dtype for the P V product (fp32
accumulation over the 512 latent columns); O rescaled by exp2(m_old - m_new) every tile; a
split's O / l in fp32, merged, then rounded to q's dtype."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.mla as ref
from tskernels.numerics import assert_close
from tskernels.ops.mla import cuda_decode
from tskernels.testing import strategies as tst

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_mla import _latent
except ImportError:
    from test_mla import _latent


def model_decode(q, cache, page_table, seq_lens, scale, num_splits, kv_scale=None):
    """What the kernel (and the merge) compute, in torch float32 (see the module docstring).
    An fp8 cache (kv_scale given): rows exact in f16, q and P rounded to f16 (the MMAs' type),
    the logits' constant and the output scaled by kv_scale."""
    fp8 = kv_scale is not None
    mma = torch.float16 if fp8 else q.dtype
    ks = float(kv_scale) if fp8 else 1.0
    c = scale * math.log2(math.e) * ks
    B, H = q.shape[:2]
    ps = cache.shape[1]
    out = torch.zeros(B, H, 512, dtype=q.dtype)
    for b in range(B):
        L = int(seq_lens[b])
        rows = torch.stack([cache[int(page_table[b, j // ps]), j % ps] for j in range(L)]) \
            if L else cache[:0, 0]
        tiles = -(-L // 64)
        per = -(-tiles // num_splits)
        parts = []
        for s in range(num_splits):
            t0, t1 = s * per, min(tiles, s * per + per)
            if t1 <= t0:
                continue
            qs = q[b].to(mma).float()                           # [H, 576]
            m = torch.full((H,), -math.inf)
            l_ = torch.zeros(H)
            o = torch.zeros(H, 512)
            for t in range(t0, t1):
                kv = rows[64 * t:min(64 * t + 64, L)].float()   # [n, 576]
                sc = qs @ kv.T
                m_new = torch.maximum(m, sc.amax(-1) * c)
                alpha = torch.exp2(m - m_new)
                p = torch.exp2(sc * c - m_new[:, None])
                l_ = l_ * alpha + p.sum(-1)
                o = o * alpha[:, None] + p.to(mma).float() @ kv[:, :512]
                m = m_new
            parts.append((ks * o / l_[:, None], (m + torch.log2(l_)) * math.log(2)))
        if parts:
            lse = torch.stack([x[1] for x in parts])            # [S', H]
            w = torch.softmax(lse, 0)
            out[b] = sum(w[i][:, None] * parts[i][0] for i in range(len(parts))).to(q.dtype)
    return out


@st.composite
def problem(draw):
    return dict(lens=draw(tst.seq_lens(max_batch=2, max_len=300)),
                page_size=draw(st.sampled_from([64, 128])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                splits=draw(st.sampled_from([1, 2, 5])), fp8=draw(st.booleans()),
                spread=draw(st.sampled_from([0.0, 1.0, 4.0])),
                seed=draw(st.integers(0, 2**31 - 1)))


@given(c=problem())
def test_cuda_mla_decode_arithmetic_matches_reference(c):
    gen = torch.Generator().manual_seed(c["seed"])
    kv, cache, scale = _latent(c, "cpu", gen)
    # spread 0: all-zero q (uniform softmax); larger: wide logit ranges, most p tiny
    q = (torch.randn(len(c["lens"]), 64, 576, generator=gen) * c["spread"]).to(c["dtype"])
    o = model_decode(q, cache, kv.page_table, kv.seq_lens, 0.07, c["splits"], scale)
    c64 = cache if c["fp8"] else cache.double()
    truth = ref.decode(q.double(), c64, kv.page_table, kv.seq_lens, scale=0.07, kv_scale=scale)
    same = ref.decode(q, cache, kv.page_table, kv.seq_lens, scale=0.07, kv_scale=scale)
    assert_close(o, truth, baseline=same, name=f"cuda mla decode arithmetic {c}")


def test_cuda_mla_decode_default_splits():
    """One wave of one-CTA-per-SM work items, two tiles per split at least, no split for a
    batch that fills the GPU alone."""
    assert cuda_decode.default_splits(64, 128, 4096, 132) == 1     # 128 CTAs
    assert cuda_decode.default_splits(16, 128, 4096, 132) == 4     # 32 x 4
    assert cuda_decode.default_splits(64, 64, 4096, 132) == 2
    assert cuda_decode.default_splits(1, 128, 4096, 132) == 32     # 64 tiles / 2
    assert cuda_decode.default_splits(1, 128, 100, 132) == 1
    assert cuda_decode.default_splits(1, 64, 10**6, 132) == 128
    assert cuda_decode.default_splits(1, 64, 32768, 132) == 128   # 512 tiles
    assert cuda_decode.default_splits(1, 128, 32768, 132) == 66   # 2 head blocks


def test_cuda_mla_decode_registration_and_plan_checks():
    """Hopper only (sm_90a), 512 + 64, any head count in 64-head blocks, pages 64 / 128 / 256,
    a 16-bit cache of q's dtype or fp8-e4m3 latents; the selector never offers it on this CPU machine; the plan rejects what it cannot run
    before compiling anything."""
    spec = next(k for k in tskernels.kernels() if k.name == "mla.decode.cuda")
    assert spec.band == "specialized"
    assert (spec.capability.min_sm, spec.capability.max_sm) == (90, 90)
    assert spec.verification.compiled == frozenset({"sm_90"})
    assert set(spec.formats["kv"]) == {"bf16", "fp16", "fp8_e4m3:per_tensor"}
    t = spec.traits
    assert t["cache_like_q"](True) and not t["cache_like_q"](False)  # no fp16 cache for bf16 q
    assert t["num_heads"](16) and t["num_heads"](128) and not t["num_heads"](0)
    # auto-selected only where measured faster than the Triton kernel (16 heads and more)
    assert spec.prefer["num_heads"](16) and spec.prefer["num_heads"](128) \
        and not spec.prefer["num_heads"](8)
    assert t["page_size"](64) and not t["page_size"](16) and not t["page_size"](32)
    assert t["kv_lora_rank"](512) and not t["kv_lora_rank"](256)
    assert t["rope_dim"](64) and not t["rope_dim"](32)
    report = tskernels.explain("mla", "decode", device="cpu",
                               formats={"q": "bf16", "kv": "bf16"},
                               traits={"kv_lora_rank": 512, "rope_dim": 64, "page_size": 64,
                                       "num_heads": 128})
    line = next(ln for ln in report.splitlines() if ln.strip().startswith("cuda"))
    assert "filtered: vendor 'cpu'" in line, report
    pt, lens = torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    ok = dict(num_heads=128, kv_lora_rank=512, rope_dim=64, page_size=64, scale=0.1)
    for change, match in (({"num_heads": 0}, "heads"),
                          ({"page_size": 16}, "page size"), ({"rope_dim": 32}, "rope 64 only"),
                          ({"q_dtype": torch.float32}, "bf16 or fp16"),
                          ({"kv_dtype": torch.float32}, "same dtype"),
                          ({"kv_dtype": torch.float8_e4m3fn}, "CUDA device"),
                          ({}, "CUDA device")):
        with pytest.raises(ValueError, match=match):
            cuda_decode.CudaMLADecodePlan(pt, lens, **{**ok, **change})
