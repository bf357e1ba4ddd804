"""Every SIMD path (AVX-512, AVX2+FMA, NEON, portable; the TSKERNELS_CPU_ISA cap picks one per
call) of the C++ SiLU-and-mul and paged decode attention kernels against float64 references:
row lengths that are and are not multiples of 8 / 16 lanes, gate values far outside the exp
polynomial's clamp, GQA groups 1-8, head dims 64 / 128 (vector paths) and 32 (portable loop),
fp32 and bf16 caches, lengths 0, 1 and not a multiple of the page size."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels_ref.activation as ref_act
import tskernels_ref.attention as ref_attn
from tskernels.numerics import assert_close
from tskernels.ops._common import cpu_extension

from ._cpu_paths import each_path

_cpu = cpu_extension()
pytestmark = pytest.mark.skipif(_cpu is None, reason="tskernels._cpu not built")


@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([1, 3, 8]),
       inter=st.sampled_from([1, 7, 8, 9, 16, 23, 1536]), scale=st.sampled_from([1.0, 4.0, 60.0]))
def test_silu_and_mul_every_path(seed, rows, inter, scale):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * inter, generator=g) * scale  # 60: exp clamps at both ends
    want = ref_act.silu_and_mul(x.double())
    base = ref_act.silu_and_mul(x)

    def check(path):
        y = torch.full((rows, inter), float("nan"))
        _cpu.silu_and_mul_f32(x.data_ptr(), x.stride(0), y.data_ptr(), inter, rows, inter)
        assert torch.isfinite(y).all(), path
        assert_close(y, want, baseline=base, name=f"silu_and_mul, {path} path")
    each_path(check)


def _paged(seed, lens, page_size, hkv, d, cache_dtype):
    g = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_each) + 2
    kc = (torch.randn(num_pages, page_size, hkv, d, generator=g) * 3).to(cache_dtype)
    vc = torch.randn(num_pages, page_size, hkv, d, generator=g).to(cache_dtype)
    perm = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(lens), max(pages_each + [1]) + 1, dtype=torch.int32)
    for b, n in enumerate(pages_each):
        table[b, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    return g, kc, vc, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,hq,hkv", [(64, 9, 3), (64, 8, 1), (128, 4, 4), (128, 6, 2),
                                      (32, 4, 2)])
def test_decode_attention_every_path(d, hq, hkv, cache_dtype):
    g, kc, vc, table, seq = _paged(7, [0, 1, 7, 8, 37, 100], 16, hkv, d, cache_dtype)
    q = torch.randn(len(seq), hq, d, generator=g)
    want = ref_attn.decode(q.double(), kc.double(), vc.double(), table, seq)
    base = ref_attn.decode(q, kc.float(), vc.float(), table, seq)

    def check(path):
        o = torch.full_like(q, float("nan"))
        _cpu.decode_attn_f32(q.data_ptr(), q.stride(0), q.stride(1), kc.data_ptr(), vc.data_ptr(),
                             kc.shape[0], 16, hkv, d, table.data_ptr(), table.stride(0),
                             table.shape[1], seq.data_ptr(), len(seq), hq, d ** -0.5,
                             o.data_ptr(), o.stride(0), o.stride(1),
                             bf16_cache=cache_dtype == torch.bfloat16)
        assert_close(o, want, baseline=base, name=f"decode attention, {path} path")
    each_path(check)
