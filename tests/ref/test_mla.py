"""tskernels_ref.mla vs a naive float64 per-request, per-head, per-query formulation."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tskernels_ref import mla
from tskernels_ref._common import FP8_DTYPE

from ._problems import PAGE_SIZES, build_paged, extend_lengths, indptr, rand

LORA, ROPE = 512, 64


def naive_mla(q, rows, q_pos, scale, causal=True):
    """q [n, H, 576], rows [L, 576] (float64) -> o [n, H, 512]."""
    n, heads, _ = q.shape
    o = torch.zeros(n, heads, LORA, dtype=torch.float64)
    for i in range(n):
        visible = [j for j in range(rows.shape[0]) if j <= q_pos[i] or not causal]
        if not visible:
            continue
        for h in range(heads):
            s = torch.tensor([scale * float(q[i, h].double() @ rows[j]) for j in visible], dtype=torch.float64)
            w = torch.exp(s - s.max())
            w = w / w.sum()
            o[i, h] = sum(w[t] * rows[j, :LORA] for t, j in enumerate(visible))
    return o


@settings(max_examples=15, deadline=None)
@given(lens=extend_lengths(max_batch=3, max_len=20), decode=st.booleans(), page_size=PAGE_SIZES,
       heads=st.sampled_from([1, 3, 16]), cache=st.sampled_from(["fp32", "bf16", "fp8"]),
       causal=st.booleans(), seed=st.integers(0, 2**31))
def test_mla_matches_naive(lens, decode, page_size, heads, cache, causal, seed):
    seq_lens, new = lens
    if decode:
        new = [1] * len(seq_lens)
        causal = True
    gen = torch.Generator().manual_seed(seed)
    dense = [rand(n, LORA + ROPE, gen=gen) for n in seq_lens]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": FP8_DTYPE}[cache]
    kv_scale = torch.tensor(0.02) if cache == "fp8" else None
    if cache == "fp8":
        dense = [d / 0.02 for d in dense]  # stored values, dequantized by kv_scale below
    paged = build_paged(dense, page_size, dtype, gen)
    q_dtype = torch.bfloat16 if cache == "bf16" else torch.float32
    q = rand(sum(new), heads, LORA + ROPE, gen=gen).to(q_dtype)
    scale = 1.0 / math.sqrt(192)
    if decode:
        o = mla.decode(q, paged.cache, paged.page_table, paged.seq_lens, scale=scale, kv_scale=kv_scale)
    else:
        o = mla.extend(q, paged.cache, indptr(new), paged.page_table, paged.seq_lens, scale=scale,
                       causal=causal, kv_scale=kv_scale)
    assert o.shape == (sum(new), heads, LORA) and o.dtype == q_dtype and not o.isnan().any()
    start, wants = 0, []
    for b, length in enumerate(seq_lens):
        rows = dense[b].to(dtype).double() * (0.02 if cache == "fp8" else 1.0)
        n = new[b]
        wants.append(naive_mla(q[start : start + n], rows, list(range(length - n, length)), scale, causal))
        start += n
    tol = 2e-2 if cache == "bf16" else 1e-5
    torch.testing.assert_close(o.double(), torch.cat(wants), rtol=tol, atol=tol)
