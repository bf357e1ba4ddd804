"""Shared builders of the attention/MLA kernel tests (no tests here): problems + references."""
from __future__ import annotations

import torch

import tskernels_ref.attention as ref
from tskernels.testing.problems import paged_kv

FP8 = torch.float8_e4m3fn


def q_dtypes(device: str) -> tuple[torch.dtype, ...]:
    # The interpreter computes bf16 tl.dot wrongly: CPU runs fp16/fp32 only.
    return (torch.float16, torch.float32) if device == "cpu" else \
        (torch.bfloat16, torch.float16, torch.float32)


def make_paged(lens, page_size, hkv, d, dtype, kv_mode, device, gen):
    """kv_mode: None (cache in q's dtype), "per_tensor" or "per_head" (fp8 cache)."""
    return paged_kv(lens, page_size, hkv, d, dtype=dtype, device=device,
                    kv_dtype=FP8 if kv_mode else dtype, per_head_scale=kv_mode == "per_head",
                    gen=gen)


def references(fn, q, kv, *args, **kw):
    """(float64 ground truth, same-precision PyTorch result) of a reference op.

    fp8 caches stay fp8 in both (dequantization is part of the op); the float64 truth upcasts
    q and a float cache."""
    fp8 = kv.k_cache.dtype == FP8
    k64 = kv.k_cache if fp8 else kv.k_cache.double()
    v64 = kv.v_cache if fp8 else kv.v_cache.double()
    cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
    args = [cpu(a) for a in args]
    kw = {k: cpu(v) for k, v in kw.items()}
    truth = fn(q.double().cpu(), cpu(k64), cpu(v64), *args, cpu(kv.page_table),
               cpu(kv.seq_lens), **kw)
    same = fn(q.cpu(), cpu(kv.k_cache), cpu(kv.v_cache), *args, cpu(kv.page_table),
              cpu(kv.seq_lens), **kw)
    return truth, same


def ref_decode(q, kv, **kw):
    return references(ref.decode, q, kv, **kw)


def ref_extend(q, kv, qo_indptr, **kw):
    return references(ref.extend, q, kv, qo_indptr, **kw)


def capture_graph(run) -> torch.cuda.CUDAGraph:
    """Warm `run` up on a side stream (compiles kernels outside the capture), then capture it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    return g
