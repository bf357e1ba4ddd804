"""CPU tier for the CUDA fp8 decode's arithmetic (the kernel itself needs a GPU): a float model
of exactly what `cuda/decode_fp8.cu` computes — q split into hi = e4m3(q * qs) and lo =
e4m3((q * qs - hi) * rs) with per-head scales, e4m3 x e4m3 products summed in fp32, an online
softmax over 32-key slices, p split into e4m3(256 p) and e4m3(16 * residual), V used as stored —
held to q's dtype tolerance against the reference on the exactly dequantised cache, as the GPU
tests hold the kernel. Guards the scaling choices (448 / max per row, 256 and 16 for p) against
hostile inputs: wide logit spreads (most p tiny), constant rows, zero q."""
from __future__ import annotations

import math

import torch
from hypothesis import given, strategies as st

from tskernels.numerics import assert_close
from tskernels.testing import strategies as tst

try:  # tests/kernels as a package or as a plain directory on sys.path
    from .test_attention_common import make_paged, ref_decode
except ImportError:
    from test_attention_common import make_paged, ref_decode

FP8 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(FP8).float()


def _split(x: torch.Tensor, s: float, r: float):
    """(hi, lo) as the kernel's split4: hi = e4m3(x s), lo = e4m3((x s - hi) r)."""
    y = x * s
    hi = _e4m3(y)
    return hi, _e4m3((y - hi) * r)


def model_decode(q, kv, scale, slice_keys=32):
    """The CUDA kernel's arithmetic in float32 (one warp's slice order; the warps' final
    combination is exact fp32 and left out)."""
    B, hq, d = q.shape
    hkv = kv.k_cache.shape[2]
    G = hq // hkv
    out = torch.zeros(B, hq, d)
    for b in range(B):
        n = int(kv.seq_lens[b])
        if n == 0:
            continue
        pages = kv.page_table[b, : math.ceil(n / kv.page_size)].long()
        k8 = kv.k_cache[pages].reshape(-1, hkv, d)[:n].float()
        v8 = kv.v_cache[pages].reshape(-1, hkv, d)[:n].float()
        for h in range(hkv):
            ks = float(kv.k_scale.reshape(-1)[h if kv.k_scale.numel() > 1 else 0])
            vs = float(kv.v_scale.reshape(-1)[h if kv.v_scale.numel() > 1 else 0])
            for g in range(G):
                qf = q[b, h * G + g].float()
                mx = float(qf.abs().max())
                qs = 448.0 / mx if mx > 0 else 1.0
                y = qf * qs
                res = (y - _e4m3(y)).abs().max()
                rs = 448.0 / float(res) if res > 0 else 1.0
                hi, lo = _split(qf, qs, rs)
                qk = scale * ks * LOG2E
                s = (k8[:, h] @ hi) * (qk / qs) + (k8[:, h] @ lo) * (qk / (qs * rs))
                m, l, acc = -math.inf, 0.0, torch.zeros(d)
                for i in range(0, n, slice_keys):
                    sl = s[i:i + slice_keys]
                    m_new = max(m, float(sl.max()))
                    alpha = 2.0 ** (m - m_new)
                    p = torch.exp2(sl - m_new)
                    l = l * alpha + float(p.sum())
                    ph, pl = _split(p, 256.0, 16.0)
                    vv = v8[i:i + slice_keys, h]
                    acc = acc * alpha + (ph @ vv + (pl @ vv) / 16.0) / 256.0
                    m = m_new
                out[b, h * G + g] = acc / l * vs
    return out.to(q.dtype)


@st.composite
def problem(draw):
    hkv = draw(st.integers(1, 2))
    return dict(lens=draw(tst.seq_lens(max_batch=3, max_len=200)),
                page_size=draw(st.sampled_from([1, 16, 64])), hkv=hkv,
                group=draw(st.sampled_from([1, 3, 4, 8])),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                kv_mode=draw(st.sampled_from(["per_tensor", "per_head"])),
                spread=draw(st.sampled_from([0.0, 1.0, 4.0, 12.0])),
                seed=draw(st.integers(0, 2**31 - 1)))


@given(c=problem())
def test_cuda_decode_arithmetic_matches_reference(c):
    gen = torch.Generator().manual_seed(c["seed"])
    kv = make_paged(c["lens"], c["page_size"], c["hkv"], 128, c["dtype"], c["kv_mode"], "cpu",
                    gen)
    hq = c["hkv"] * c["group"]
    # spread 0: every row of q zero (uniform softmax); larger: wide logit ranges, most p tiny
    q = (torch.randn(len(c["lens"]), hq, 128, generator=gen) * c["spread"]).to(c["dtype"])
    o = model_decode(q, kv, 128 ** -0.5)
    truth, same = ref_decode(q, kv, k_scale=kv.k_scale, v_scale=kv.v_scale)
    assert_close(o, truth, baseline=same, name=f"cuda decode arithmetic {c}")


def test_cuda_run_argument_checks():
    """The CUDA plan's host-side checks (run before any launch), on CPU tensors: valid
    arguments pass, each broken one gets a clear ValueError."""
    from types import SimpleNamespace

    import pytest

    from tskernels.ops.attention.cuda_decode import check_run_args
    plan = SimpleNamespace(q_dtype=torch.bfloat16, batch=2, hq=8, d=128, hkv=2, page_size=16)
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    kc = torch.zeros(5, 16, 2, 128, dtype=FP8)
    vc = torch.zeros(5, 16, 2, 128, dtype=FP8)
    one, per_head = torch.ones(1), torch.ones(2)
    ok = dict(q=q, k_cache=kc, v_cache=vc, sinks=None, k_scale=one, v_scale=one, out=None)
    check_run_args(plan, **ok)
    check_run_args(plan, **{**ok, "k_scale": per_head, "v_scale": per_head,
                            "out": torch.empty_like(q)})
    bad = [({"sinks": torch.zeros(8)}, "sinks"), ({"k_scale": None}, "required"),
           ({"q": q.half()}, "planned for"), ({"v_cache": vc.float()}, "planned for"),
           ({"q": q[:1]}, "q must be"), ({"out": torch.empty(2, 8, 128)}, "out must be"),
           ({"k_cache": kc[:, :8]}, "k_cache must be"),
           ({"v_cache": torch.zeros(5, 16, 2, 136, dtype=FP8)[..., :128]}, "16-byte"),
           ({"k_scale": one.double()}, "k_scale must be"),
           ({"v_scale": torch.ones(3)}, "v_scale must be"),
           ({"k_scale": per_head}, "both be per-tensor or per-head")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            check_run_args(plan, **{**ok, **change})
