"""Problem generators of the built-in ops for the conformance test (see `conformance`).

Each draws a small valid problem in the op's kernel calling convention, with the edges the
kernels get wrong first: ragged lengths including 0 and 1, lengths that are not a multiple of
the page size, permuted page tables, NaN in every slot no request owns, GQA ratios above 1.
"large" problems (GPU tier) are longer and wider.
"""
from __future__ import annotations

import torch

import tskernels_ref.norm as ref_norm
import tskernels_ref.rope as ref_rope

from ..ops.attention import _validate as attn_v
from ..ops.moe import cuda_decode_sm90
from ..registry import fmt
from .conformance import Case, problem_generator
from .problems import paged_kv, ragged_lens

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype)


def _pick(gen, choices):
    return choices[int(torch.randint(len(choices), (1,), generator=gen))]


# ---- elementwise ----------------------------------------------------------------------------

@problem_generator("norm", "rmsnorm")
def _rmsnorm(gen, dtype, size):
    rows, n = (5, _pick(gen, (64, 96))) if size == "small" else (257, 4096)
    x, w = _randn(gen, rows, n, dtype=dtype), _randn(gen, n, dtype=dtype)
    return Case((x, w, 1e-6), {"out": None}, {"x": fmt(dtype), "weight": fmt(dtype)},
                {"hidden": n}, label=f"rmsnorm {rows}x{n} {dtype}")


@problem_generator("norm", "fused_add_rmsnorm")
def _fused_add_rmsnorm(gen, dtype, size):
    rows, n = (5, 64) if size == "small" else (257, 4096)
    x, r, w = (_randn(gen, rows, n, dtype=dtype), _randn(gen, rows, n, dtype=dtype),
               _randn(gen, n, dtype=dtype))
    return Case((x, r, w, 1e-6), {}, {"x": fmt(dtype), "weight": fmt(dtype)}, {"hidden": n},
                label=f"fused_add_rmsnorm {rows}x{n} {dtype}")


def _gated(op):
    def gen_case(gen, dtype, size):
        rows, inter = (7, 48) if size == "small" else (513, 14336)
        x = _randn(gen, rows, 2 * inter, dtype=dtype)
        return Case((x,), {"out": None}, {"x": fmt(dtype)}, label=f"{op} {rows}x{inter} {dtype}")
    return gen_case


problem_generator("activation", "silu_and_mul")(_gated("silu_and_mul"))
problem_generator("activation", "gelu_tanh_and_mul")(_gated("gelu_tanh_and_mul"))


@problem_generator("rope", "apply_rope")
def _apply_rope(gen, dtype, size):
    t, hq, hk, d = (6, 4, 2, 64) if size == "small" else (300, 32, 8, 128)
    style = _pick(gen, ("neox", "gptj"))
    rot = _pick(gen, (d, d // 2))  # full and partial rotary
    cache = ref_rope.cos_sin_cache(64 if size == "small" else 4096, rot, 10000.0)
    pos = torch.randint(0, cache.shape[0], (t,), generator=gen, dtype=torch.int64)
    q, k = _randn(gen, t, hq, d, dtype=dtype), _randn(gen, t, hk, d, dtype=dtype)
    return Case((q, k, pos, cache), {"style": style, "inplace": False}, {"q": fmt(dtype)},
                {"style": style}, tol_dtype=dtype, label=f"rope {style} rot {rot} {dtype}")


# ---- gemm -----------------------------------------------------------------------------------

@problem_generator("gemm", "mm")
def _mm(gen, dtype, size):
    m, n, k = (_pick(gen, (1, 5, 33)), 48, 64) if size == "small" else (257, 2048, 4096)
    a, b = _randn(gen, m, k, dtype=dtype), _randn(gen, n, k, dtype=dtype) / k ** 0.5
    return Case((a, b), {"out_dtype": None}, {"a": fmt(dtype), "b": fmt(dtype), "c": fmt(dtype)},
                label=f"mm {m}x{n}x{k} {dtype}")


@problem_generator("gemm", "gemv")
def _gemv(gen, dtype, size):
    m, n, k = (_pick(gen, (1, 3, 16)), 40, 96) if size == "small" else (8, 4096, 4096)
    a, b = _randn(gen, m, k, dtype=dtype), _randn(gen, n, k, dtype=dtype) / k ** 0.5
    return Case((a, b), {"out_dtype": None}, {"a": fmt(dtype), "b": fmt(dtype), "c": fmt(dtype)},
                label=f"gemv {m}x{n}x{k} {dtype}")


def _fused_gemv_case(gen, dtype, size, op):
    """A fused decode gemv (rmsnorm_gemv / silu_mul_gemv) over decode rows, with or without
    the residual added before the one rounding."""
    m, n, k = (_pick(gen, (1, 3, 16)), 40, 96) if size == "small" else (8, 4096, 4096)
    with_res = bool(torch.randint(2, (1,), generator=gen))
    b = _randn(gen, n, k, dtype=dtype) / k ** 0.5
    res = _randn(gen, m, n, dtype=dtype) if with_res else None
    if op == "rmsnorm_gemv":
        x = _randn(gen, m, k, dtype=dtype) * 2
        args, kw = (x, torch.rand(k, generator=gen) + 0.5, b), {"eps": 1e-6}
    else:
        args, kw = (_randn(gen, m, 2 * k, dtype=dtype), b), {}
    return Case(args, {**kw, "out_dtype": None, "residual": res},
                {"x": fmt(dtype), "b": fmt(dtype), "c": fmt(dtype)}, {"residual": with_res},
                label=f"{op} {m}x{n}x{k} res {with_res} {dtype}")


@problem_generator("gemm", "rmsnorm_gemv")
def _rmsnorm_gemv(gen, dtype, size):
    return _fused_gemv_case(gen, dtype, size, "rmsnorm_gemv")


@problem_generator("gemm", "silu_mul_gemv")
def _silu_mul_gemv(gen, dtype, size):
    return _fused_gemv_case(gen, dtype, size, "silu_mul_gemv")


@problem_generator("gemm", "int8w_mm", dtypes=(torch.float32, torch.bfloat16))
def _int8w_mm(gen, dtype, size):
    """Weight-only int8 (per-row scales, as gemm.quantize_int8_per_channel makes them): decode
    rows (the streamed path, M <= 16) and a prefill block (the dequantizing path)."""
    from tskernels.ops.gemm.int8w import quantize_int8_per_channel
    m, n, k = ((_pick(gen, (1, 5, 40)), 48, 96) if size == "small"
               else (_pick(gen, (1, 8, 300)), 2048, 4096))
    q, scale = quantize_int8_per_channel(_randn(gen, n, k, dtype=torch.float32) / k ** 0.5)
    return Case((_randn(gen, m, k, dtype=dtype), q, scale), {"out_dtype": None},
                {"a": fmt(dtype), "b": "int8", "c": fmt(dtype)},
                label=f"int8w_mm {m}x{n}x{k} {dtype}")


@problem_generator("gemm", "q4w_mm", dtypes=(torch.float32, torch.bfloat16))
def _q4w_mm(gen, dtype, size):
    """4-bit weights in groups of 32 (gemm.quantize_q4_groups, GGUF Q4_1's layout), with float
    activations or int8 activation groups (act_int8: the reference quantizes them the same
    way), decode rows and a prefill block."""
    from tskernels.ops.gemm.q4w import quantize_q4_groups
    m, n, k = ((_pick(gen, (1, 5, 40)), 48, 96) if size == "small"
               else (_pick(gen, (1, 8, 300)), 2048, 4096))
    q, scale, mins = quantize_q4_groups(_randn(gen, n, k, dtype=torch.float32) / k ** 0.5)
    act_int8 = bool(_pick(gen, (0, 1)))
    return Case((_randn(gen, m, k, dtype=dtype), q, scale, mins),
                {"act_int8": act_int8, "out_dtype": None},
                {"a": fmt(dtype), "b": "uint4", "c": fmt(dtype)},
                label=f"q4w_mm {m}x{n}x{k} act_int8={act_int8} {dtype}")


# ---- paged attention ------------------------------------------------------------------------

def _paged(gen, dtype, size, *, min_len=0):
    batch, max_len = (3, 40) if size == "small" else (8, 1500)
    lens = [max(min_len, n) for n in ragged_lens(batch, max_len, gen=gen)]
    hkv, group, d = _pick(gen, (1, 2)), _pick(gen, (1, 4)), (64 if size == "small" else 128)
    page = _pick(gen, (1, 16) if size == "small" else (16, 64))
    kv = paged_kv(lens, page, hkv, d, dtype, gen=gen)
    return lens, hkv * group, d, kv


def _options(gen):
    return _pick(gen, ({}, {"softcap": 20.0}, {"sliding_window": 24}))


@problem_generator("attention", "decode")
def _decode(gen, dtype, size):
    lens, hq, d, kv = _paged(gen, dtype, size)
    q = _randn(gen, len(lens), hq, d, dtype=dtype)
    opts = _options(gen)
    prob = attn_v.problem(q, kv.k_cache, None, softcap=opts.get("softcap"),
                          sliding_window=opts.get("sliding_window"), sinks=None, decode=True)
    kw = dict(dict(scale=d ** -0.5, sliding_window=None, softcap=None, sinks=None,
                   k_scale=None, v_scale=None), **opts)
    return Case((q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens), kw, prob["formats"],
                prob["traits"], label=f"decode lens {lens} page {kv.page_size} {opts} {dtype}")


@problem_generator("attention", "extend")
def _extend(gen, dtype, size):
    lens, hq, d, kv = _paged(gen, dtype, size, min_len=1)
    new = [max(1, n - int(torch.randint(0, n, (1,), generator=gen))) for n in lens]
    indptr = torch.tensor([0] + new, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = _randn(gen, int(indptr[-1]), hq, d, dtype=dtype)
    prefix = any(n != m for n, m in zip(lens, new))
    prob = attn_v.problem(q, kv.k_cache, None, softcap=None, sliding_window=None, sinks=None)
    traits = dict(prob["traits"], causal=True, new_kv=False, prefix=prefix)
    kw = dict(causal=True, scale=d ** -0.5, sliding_window=None, softcap=None, sinks=None,
              k_scale=None, v_scale=None)
    return Case((q, kv.k_cache, kv.v_cache, indptr, kv.page_table, kv.seq_lens), kw,
                prob["formats"], traits, label=f"extend lens {lens} new {new} {dtype}")


@problem_generator("attention", "store_kv")
def _store_kv(gen, dtype, size):
    lens, _, d, kv = _paged(gen, dtype, size, min_len=1)
    t, hkv = len(lens), kv.k_cache.shape[2]
    # one new token per request, at its last position (slot -1: a padding row, skipped)
    slots = [int(kv.page_table[b, (n - 1) // kv.page_size]) * kv.page_size + (n - 1)
             % kv.page_size for b, n in enumerate(lens)]
    slots[-1] = -1
    k, v = _randn(gen, t, hkv, d, dtype=dtype), _randn(gen, t, hkv, d, dtype=dtype)
    return Case((k, v, kv.k_cache, kv.v_cache, torch.tensor(slots, dtype=torch.int64)),
                {"k_scale": None, "v_scale": None}, {"k": fmt(dtype), "kv": fmt(dtype)},
                {"head_dim": d}, outputs=lambda _, a: (a[2], a[3]),
                label=f"store_kv slots {slots} {dtype}")


@problem_generator("attention", "rope_store_kv")
def _rope_store_kv(gen, dtype, size):
    """A decode step's q/k/v as views of one qkv row (as served), each request's token at its
    last slot (one padding row, slot -1), full or partial rotary, with or without q/k norm."""
    lens, hq, d, kv = _paged(gen, dtype, size, min_len=1)
    t, hkv = len(lens), kv.k_cache.shape[2]
    slots = [int(kv.page_table[b, (n - 1) // kv.page_size]) * kv.page_size + (n - 1)
             % kv.page_size for b, n in enumerate(lens)]
    slots[-1] = -1
    q, k, v = _randn(gen, t, hq + 2 * hkv, d, dtype=dtype).split([hq, hkv, hkv], dim=1)
    style, rot = _pick(gen, ("neox", "gptj")), _pick(gen, (d, d // 2))
    cache = ref_rope.cos_sin_cache(4096, rot, 10000.0)
    pos = torch.tensor([n - 1 for n in lens], dtype=torch.int64)
    norm = bool(_pick(gen, (0, 1)))
    w = [(torch.rand(d, generator=gen) + 0.5).to(dtype) if norm else None for _ in range(2)]
    return Case((q, k, v, pos, cache, kv.k_cache, kv.v_cache,
                 torch.tensor(slots, dtype=torch.int64)),
                {"style": style, "q_norm_weight": w[0], "k_norm_weight": w[1], "eps": 1e-6},
                {"q": fmt(dtype), "kv": fmt(dtype)},
                {"head_dim": d, "style": style, "qk_norm": norm},
                outputs=lambda qo, a: (qo, a[5], a[6]),
                label=f"rope_store_kv {style} rot {rot} norm {norm} slots {slots} {dtype}")


@problem_generator("attention", "merge_states")
def _merge_states(gen, dtype, size):
    n, h, d = (5, 3, 64) if size == "small" else (512, 32, 128)
    lse_a, lse_b = torch.randn(n, h, generator=gen), torch.randn(n, h, generator=gen)
    lse_b[0, 0] = float("-inf")  # a split that saw no key
    return Case((_randn(gen, n, h, d, dtype=dtype), lse_a, _randn(gen, n, h, d, dtype=dtype),
                 lse_b), {}, {"o": fmt(dtype)}, label=f"merge_states {n}x{h}x{d} {dtype}")


# ---- MLA ------------------------------------------------------------------------------------

def _latent(gen, dtype, size, *, min_len=0):
    batch, max_len = (3, 40) if size == "small" else (8, 2000)
    lens = [max(min_len, n) for n in ragged_lens(batch, max_len, gen=gen)]
    rank, rope, heads = (64, 16, _pick(gen, (2, 16))) if size == "small" else (512, 64, 128)
    page = _pick(gen, (1, 16) if size == "small" else (64,))
    kv = paged_kv(lens, page, 1, rank + rope, dtype, gen=gen)
    return lens, rank, heads, kv.k_cache[:, :, 0].contiguous(), kv


def _mla_traits(q, cache, rank, page):
    return {"kv_lora_rank": rank, "rope_dim": q.shape[2] - rank, "page_size": page,
            "num_heads": q.shape[1], "cache_like_q": cache.dtype == q.dtype}


@problem_generator("mla", "decode")
def _mla_decode(gen, dtype, size):
    lens, rank, heads, cache, kv = _latent(gen, dtype, size)
    q = _randn(gen, len(lens), heads, cache.shape[2], dtype=dtype)
    kw = dict(scale=cache.shape[2] ** -0.5, kv_lora_rank=rank, kv_scale=None)
    return Case((q, cache, kv.page_table, kv.seq_lens), kw,
                {"q": fmt(dtype), "kv": fmt(dtype)}, _mla_traits(q, cache, rank, kv.page_size),
                label=f"mla decode lens {lens} heads {heads} {dtype}")


@problem_generator("mla", "extend")
def _mla_extend(gen, dtype, size):
    lens, rank, heads, cache, kv = _latent(gen, dtype, size, min_len=1)
    # the float64 truth runs on the host: 128 heads x 576 wide over 2000-token contexts is
    # ~0.6 TFLOP per 1000 new tokens, so the large problems extend by at most 40 tokens (the chunk
    # sizes of serving's decode-side extend), still over the long cached contexts
    new = [max(1, n // 2) if size == "small" else max(1, min(n // 2, 40)) for n in lens]
    indptr = torch.tensor([0] + new, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = _randn(gen, int(indptr[-1]), heads, cache.shape[2], dtype=dtype)
    kw = dict(scale=cache.shape[2] ** -0.5, causal=True, kv_lora_rank=rank, kv_scale=None)
    return Case((q, cache, indptr, kv.page_table, kv.seq_lens), kw,
                {"q": fmt(dtype), "kv": fmt(dtype)}, _mla_traits(q, cache, rank, kv.page_size),
                label=f"mla extend lens {lens} new {new} {dtype}")


@problem_generator("kvcache", "store_mla")
def _store_mla(gen, dtype, size):
    lens, rank, _, cache, kv = _latent(gen, dtype, size, min_len=1)
    page = kv.page_size
    slots = [int(kv.page_table[b, (n - 1) // page]) * page + (n - 1) % page
             for b, n in enumerate(lens)]
    x = _randn(gen, len(lens), cache.shape[2], dtype=dtype)
    return Case((x, cache, torch.tensor(slots, dtype=torch.int64)), {"kv_scale": None},
                {"kv_latent": fmt(dtype), "kv": fmt(dtype)},
                {"width": cache.shape[2], "page_size": page}, outputs=lambda _, a: a[1],
                label=f"store_mla slots {slots} {dtype}")





# ---- gated delta rule -----------------------------------------------------------------------

def _gdn_heads(gen, size):
    """(key heads, value heads, K, V): grouped value heads as Qwen3-Next's 16 / 32."""
    if size == "small":
        hk = _pick(gen, (1, 2))
        return hk, hk * _pick(gen, (1, 2)), 16, _pick(gen, (16, 32))
    return 2, 4, 128, 128


def _gdn_acts(gen, n, hk, hv, dk, dv, dtype):
    return (_randn(gen, n, hk, dk, dtype=dtype), _randn(gen, n, hk, dk, dtype=dtype),
            _randn(gen, n, hv, dv, dtype=dtype),
            torch.nn.functional.logsigmoid(torch.randn(n, hv, generator=gen) + 2.0),
            torch.rand(n, hv, generator=gen).to(dtype))


def _gdn_traits(hv, dk, dv):
    return {"num_heads": hv, "head_dim_k": dk, "head_dim_v": dv}


@problem_generator("gdn", "chunk_prefill")
def _gdn_prefill(gen, dtype, size):
    lens = ragged_lens(3, 150, gen=gen) if size == "small" else ragged_lens(4, 700, gen=gen)
    hk, hv, dk, dv = _gdn_heads(gen, size)
    q, k, v, g, beta = _gdn_acts(gen, sum(lens), hk, hv, dk, dv, dtype)
    cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    init = torch.randn(len(lens), hv, dk, dv, generator=gen) * 0.5 \
        if _pick(gen, (True, False)) else None
    kw = dict(cu_seqlens=cu, initial_state=init, scale=None, chunk_size=64, use_qk_l2norm=True)
    return Case((q, k, v, g, beta), kw, {"q": fmt(dtype), "state": "fp32"},
                _gdn_traits(hv, dk, dv),
                label=f"gdn prefill lens {lens} heads {hk}/{hv} dims {dk}x{dv} "
                      f"state {init is not None} {dtype}")


@problem_generator("gdn", "decode_step")
def _gdn_decode(gen, dtype, size):
    batch = _pick(gen, (1, 3)) if size == "small" else _pick(gen, (1, 33))
    hk, hv, dk, dv = _gdn_heads(gen, size)
    q, k, v, g, beta = _gdn_acts(gen, batch, hk, hv, dk, dv, dtype)
    slots = torch.randperm(batch + 3, generator=gen)[:batch]
    pool = torch.full((batch + 3, hv, dk, dv), float("nan"))  # slots no sequence owns
    pool[slots] = torch.randn(batch, hv, dk, dv, generator=gen) * 0.5
    return Case((q, k, v, g, beta, pool, slots.to(torch.int32)),
                {"scale": None, "use_qk_l2norm": True}, {"q": fmt(dtype), "state": "fp32"},
                _gdn_traits(hv, dk, dv), outputs=lambda o, a: (o, a[5]),
                label=f"gdn decode slots {slots.tolist()} heads {hk}/{hv} {dtype}")


@problem_generator("gdn", "gate")
def _gdn_gate(gen, dtype, size):
    n, h = (9, 3) if size == "small" else (4096, 32)
    a, b = _randn(gen, n, h, dtype=dtype) * 8, _randn(gen, n, h, dtype=dtype)
    return Case((a, b, torch.randn(h, generator=gen), torch.randn(h, generator=gen)), {},
                {"a": fmt(dtype), "b": fmt(dtype)}, {"num_heads": h},
                label=f"gdn gate {n}x{h} {dtype}")


def _conv_state(gen, num_seqs, dim, width, dtype):
    slots = torch.randperm(num_seqs + 2, generator=gen)[:num_seqs]
    state = torch.full((num_seqs + 2, dim, width - 1), float("nan"))
    state[slots] = torch.randn(num_seqs, dim, width - 1, generator=gen)
    return state.to(dtype), slots.to(torch.int32)


@problem_generator("gdn", "causal_conv1d")
def _gdn_conv(gen, dtype, size):
    lens = ragged_lens(3, 40, gen=gen) if size == "small" else ragged_lens(4, 900, gen=gen)
    dim, width = (_pick(gen, (5, 130)), _pick(gen, (2, 4))) if size == "small" else (1024, 4)
    x = _randn(gen, sum(lens), dim, dtype=dtype)
    w, b = _randn(gen, dim, width, dtype=dtype) / width, _randn(gen, dim, dtype=dtype)
    state, slots = _conv_state(gen, len(lens), dim, width, dtype)
    cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    return Case((x, w, b), dict(cu_seqlens=cu, conv_state=state, state_slots=slots,
                                activation="silu"),
                {"x": fmt(dtype)}, {"width": width, "dim": dim},
                label=f"gdn conv lens {lens} dim {dim} width {width} {dtype}")


@problem_generator("gdn", "causal_conv1d_update")
def _gdn_conv_update(gen, dtype, size):
    batch, dim, width = (3, _pick(gen, (5, 130)), _pick(gen, (2, 3, 4))) if size == "small" \
        else (64, 8192, 4)
    x = _randn(gen, batch, dim, dtype=dtype)
    w, b = _randn(gen, dim, width, dtype=dtype) / width, _randn(gen, dim, dtype=dtype)
    state, slots = _conv_state(gen, batch, dim, width, dtype)
    return Case((x, state, w, b), dict(state_slots=slots, activation="silu"),
                {"x": fmt(dtype)}, {"width": width, "dim": dim},
                outputs=lambda y, a: (y, a[1]),
                label=f"gdn conv update dim {dim} width {width} {dtype}")


# ---- sampling -------------------------------------------------------------------------------

@problem_generator("sampling", "greedy")
def _greedy(gen, dtype, size):
    b, v = (3, _pick(gen, (7, 300))) if size == "small" else (64, 151936)
    x = (torch.randn(b, v, generator=gen) * 4).round().to(dtype)  # rounded: ties
    x[0, v // 2] = x[0, v - 1] = x[0].max() + 1  # a tie at the max: the lower index wins
    return Case((x,), {}, {"logits": fmt(dtype)}, label=f"greedy {b}x{v} {dtype}")


@problem_generator("sampling", "sample")
def _sample_greedy_rows(gen, dtype, size):
    """Temperature-0 rows only: seeded draws come from each backend's own RNG (they agree in
    distribution, tested per kernel), greedy rows and the chosen tokens' logprobs must agree."""
    b, v = (3, _pick(gen, (9, 200))) if size == "small" else (32, 151936)
    x = _randn(gen, b, v, dtype=dtype) * 3
    kw = dict(temperature=torch.zeros(b), top_k=torch.randint(-1, 20, (b,), generator=gen,
                                                              dtype=torch.int32),
              top_p=torch.full((b,), 0.9), min_p=torch.full((b,), 0.05),
              seeds=torch.arange(b, dtype=torch.int64), steps=torch.zeros(b, dtype=torch.int64),
              num_logprobs=0)
    return Case((x,), kw, {"logits": fmt(dtype)}, {"logprobs": False},
                outputs=lambda r, a: (r.token_ids, r.logprobs), tol_dtype=torch.float32,
                label=f"sample greedy rows {b}x{v} {dtype}")


@problem_generator("sampling", "apply_penalties", dtypes=(torch.float32, torch.float16,
                                                          torch.bfloat16))
def _penalties(gen, dtype, size):
    b, v, lo, lp = (3, 50, 20, 30) if size == "small" else (64, 151936, 1024, 4096)
    ids = lambda n: torch.randint(-1, v + 1, (b, n), generator=gen)  # noqa: E731
    kw = dict(output_ids=ids(lo), output_lens=torch.randint(0, lo + 1, (b,), generator=gen),
              prompt_ids=ids(lp).int(), prompt_lens=torch.randint(0, lp + 1, (b,),
                                                                  generator=gen).int(),
              repetition_penalty=torch.rand(b, generator=gen) + 0.5,
              presence_penalty=torch.randn(b, generator=gen),
              frequency_penalty=torch.randn(b, generator=gen) * 0.5,
              logit_bias_ids=ids(8), logit_bias_values=torch.randn(b, 8, generator=gen))
    return Case((_randn(gen, b, v, dtype=dtype) * 3,), kw, {"logits": fmt(dtype)},
                outputs=lambda r, a: (a[0],), tol_dtype=dtype,
                label=f"penalties {b}x{v} L {lo} P {lp} {dtype}")


# ---- gemm --------------------------------------------------------------------------------------

@problem_generator("gemm", "fp8_block_mm", dtypes=(torch.float32,))
def _fp8_block_mm(gen, dtype, size):
    """fp8 operands quantized by the references (1 x 128 groups, 128 x 128 blocks); N and K
    not multiples of 128 on the small problems."""
    import tskernels_ref.gemm as ref_gemm
    m, n, k = ((_pick(gen, (1, 3, 65)), 200, 300) if size == "small"
               else (_pick(gen, (1, 16, 64, 512)), 2112, 7168))
    qa, sa = ref_gemm.quantize_fp8_per_token_group(_randn(gen, m, k, dtype=dtype) * 3)
    qb, sb = ref_gemm.quantize_fp8_block(_randn(gen, n, k, dtype=dtype) * 0.05)
    return Case((qa, sa, qb, sb), {"out_dtype": torch.bfloat16, "block": 128},
                {"a": "fp8_e4m3", "b": "fp8_e4m3", "c": "bf16"}, {"block": 128},
                tol_dtype=torch.bfloat16, label=f"fp8_block_mm {m}x{n}x{k}")


def _quant_case(op, gated=False, grouped=True):
    def gen_case(gen, dtype, size):
        rows, k = (5, _pick(gen, (96, 300))) if size == "small" else (257, 7168)
        x = _randn(gen, rows, 2 * k if gated else k, dtype=dtype) * 3
        args = (x, 128) if grouped else (x, None) if op == "quantize_fp8_per_tensor" else (x,)
        return Case(args, {"eps": 1e-10}, {"x": fmt(dtype)},
                    {"group": 128} if grouped else {}, tol_dtype=torch.float8_e4m3fn,
                    label=f"{op} {rows}x{k} {dtype}")
    return gen_case


problem_generator("gemm", "quantize_fp8_per_token_group")(_quant_case("per_token_group"))
problem_generator("gemm", "silu_and_mul_quantize_fp8")(_quant_case("silu", gated=True))
problem_generator("gemm", "quantize_fp8_per_channel")(
    _quant_case("quantize_fp8_per_channel", grouped=False))
problem_generator("gemm", "quantize_fp8_per_tensor")(
    _quant_case("quantize_fp8_per_tensor", grouped=False))


# ---- moe ------------------------------------------------------------------------------------

def _distinct(gen, t, e, dtype):
    """Router logits without ties inside a row in `dtype` (a tie may legally route to either
    expert): each row is a permutation of e values 8/e apart, which bf16 and fp16 keep apart
    (the H200 conformance run drew bf16 ties from one grid spread over the whole batch)."""
    rows = torch.argsort(torch.rand(t, e, generator=gen), dim=1).float()
    return (rows / e * 8 - 4).to(dtype)


def _ids_out(result, args):
    return (result[0], result[1])


@problem_generator("moe", "topk_softmax")
def _topk_softmax(gen, dtype, size):
    t, e, k = (_pick(gen, (1, 5, 19)), _pick(gen, (8, 60)), 4) if size == "small" \
        else (_pick(gen, (1, 4096)), 128, 8)
    return Case((_distinct(gen, t, e, dtype), k), {"renormalize": True},
                {"router_logits": fmt(dtype)}, {"num_experts": e, "top_k": k},
                outputs=_ids_out, tol_dtype=torch.float32, label=f"topk_softmax {t}x{e} k{k}")


@problem_generator("moe", "rmsnorm_router_topk_softmax")
def _rmsnorm_router_topk_softmax(gen, dtype, size):
    """(add +) RMSNorm, router projection, softmax top-k, with ids that rounding cannot change.
    The tokens share a direction v, and the gate is a_e v / h plus noise, so a token's logits
    are ~a_e: k preferred experts (a = 4, 4.5, ...) above the rest (a in [-2, 2]), in a random
    order of experts. A draw is kept when the float64 chain's k + 1 best logits of every token
    lie apart by 3 % of the largest (the op rounds y and the logits to x's dtype; bf16's step is
    0.8 %): the top-k set and its order by weight have one right answer."""
    t, h, e, k = ((_pick(gen, (0, 1, 3, 17)), _pick(gen, (32, 200)), _pick(gen, (8, 60)), 4)
                  if size == "small" else (_pick(gen, (1, 64)), 2048, 128, 8))
    with_res = bool(torch.randint(2, (1,), generator=gen))
    renorm = bool(torch.randint(2, (1,), generator=gen))
    for _ in range(50):
        v = torch.randn(h, generator=gen)
        x = (1.5 * v + 0.5 * torch.randn(t, h, generator=gen)).to(dtype)
        res = (0.3 * torch.randn(t, h, generator=gen)).to(dtype) if with_res else None
        nw = torch.rand(h, generator=gen) + 0.5
        a = torch.cat([4 + 0.5 * torch.arange(k), torch.rand(e - k, generator=gen) * 4 - 2])
        a = a[torch.randperm(e, generator=gen)]
        gw = (a[:, None] * (v / nw)[None, :] / h +
              0.05 * torch.randn(e, h, generator=gen) * h ** -0.5).to(dtype)
        r = x.double() + res.double() if with_res else x.double()
        y = ref_norm.rmsnorm(r, nw.double(), 1e-6)
        top = (y @ gw.double().T).sort(dim=-1, descending=True).values[:, :k + 1]
        if t == 0 or bool((top[:, :-1] - top[:, 1:] > 0.03 * top.abs().max()).all()):
            break
    else:
        raise RuntimeError("rmsnorm_router_topk_softmax: no separated draw in 50 tries")
    return Case((x, nw, gw, k), {"residual": res, "eps": 1e-6, "renormalize": renorm},
                {"x": fmt(dtype), "norm_weight": fmt(torch.float32)},
                {"num_experts": e, "top_k": k, "hidden": h, "tokens": t},
                label=f"rmsnorm_router_topk_softmax {t}x{h} E{e} k{k} res {with_res}")


def _grouped_margin(logits, bias, g, tg, k) -> torch.Tensor:
    """Per row, the smallest gap (float64) at any comparison grouped routing decides: the
    group scores down to the (tg+1)-th, and the choice scores of the kept groups down to the
    (k+1)-th. A gap within fp32 rounding may legally route either way."""
    c = torch.sigmoid(logits.double()) + bias.double()
    t, e = c.shape
    scores = c.view(t, g, e // g).topk(2, dim=-1).values.sum(-1)       # [t, g] group scores
    gs = scores.sort(dim=-1, descending=True).values
    gap_g = (gs[:, :-1] - gs[:, 1:])[:, :tg].min(dim=-1).values
    keep = scores.topk(tg, dim=-1).indices
    mask = torch.zeros(t, g, dtype=torch.bool).scatter_(1, keep, True)
    kept = c.masked_fill(~mask.repeat_interleave(e // g, dim=1), float("-inf"))
    top = kept.topk(min(k + 1, int(mask[0].sum()) * (e // g)), dim=-1).values
    gap_e = (top[:, :-1] - top[:, 1:])[:, :k].min(dim=-1).values
    return torch.minimum(gap_g, gap_e)


def _grouped_logits(gen, t, e, dtype, bias, g, tg, k, margin=1e-4):
    """`_distinct` rows, each redrawn until every routing comparison is `margin` apart (the
    H200 conformance run drew a near-tie in fp32 group scores at T=2048)."""
    rows = _distinct(gen, t, e, dtype)
    for _ in range(64):
        bad = _grouped_margin(rows, bias, g, tg, k) <= margin
        if not bad.any():
            return rows
        rows[bad] = _distinct(gen, int(bad.sum()), e, dtype)
    raise RuntimeError("topk_sigmoid_grouped generator: could not draw tie-free rows")


@problem_generator("moe", "topk_sigmoid_grouped")
def _topk_sigmoid_grouped(gen, dtype, size):
    t, (e, g, tg, k) = ((_pick(gen, (1, 7)), (64, 8, 4, 6)) if size == "small"
                        else (_pick(gen, (1, 2048)), (256, 8, 4, 8)))
    bias = torch.randperm(e, generator=gen).float() / e * 0.1
    return Case((_grouped_logits(gen, t, e, dtype, bias, g, tg, k), bias, k),
                {"n_group": g, "topk_group": tg, "routed_scaling_factor": 2.5,
                 "renormalize": True},
                {"router_logits": fmt(dtype), "correction_bias": "fp32"},
                {"num_experts": e, "top_k": k, "n_group": g, "topk_group": tg},
                outputs=_ids_out, tol_dtype=torch.float32,
                label=f"topk_sigmoid_grouped {t}x{e} g{g}/{tg} k{k}")


@problem_generator("moe", "align_by_expert", dtypes=(torch.int32, torch.int64))
def _align_by_expert(gen, dtype, size):
    t, k, e, block = ((_pick(gen, (0, 1, 3, 40)), 2, _pick(gen, (4, 16)), _pick(gen, (1, 16)))
                      if size == "small" else (_pick(gen, (1, 64, 8192)), 8, 128, 64))
    ids = torch.randint(-1, e, (t, k), generator=gen, dtype=dtype)  # -1: non-local, dropped
    return Case((ids, e, block), {}, {"topk_ids": fmt(dtype)},
                {"num_experts": e, "block_size": block}, label=f"align {t}x{k} E{e} b{block}")


@problem_generator("moe", "fused_experts")
def _fused_experts(gen, dtype, size):
    t, h, i, e, k = ((_pick(gen, (1, 6)), 64, 32, 6, 2) if size == "small"
                     else (_pick(gen, (1, 100, 1000)), 2048, 768, 128, 8))
    x = _randn(gen, t, h, dtype=dtype)
    w13 = _randn(gen, e, 2 * i, h, dtype=torch.float32) / h ** 0.5
    w2 = _randn(gen, e, h, i, dtype=torch.float32) / i ** 0.5
    logits = _distinct(gen, t, e, torch.float32)
    w, ids = torch.softmax(logits, -1).topk(k, dim=-1)
    ids = ids.to(torch.int32)
    ids[0, -1] = -1  # a non-local expert contributes nothing
    return Case((x, w13.to(dtype), w2.to(dtype), (w / w.sum(-1, keepdim=True)).float(), ids),
                {"activation": "silu"}, {"x": fmt(dtype), "w": fmt(dtype)},
                {"activation": "silu", "top_k": k, "weight_block": None,
                 # as moe.fused_experts computes it, for the 132 SMs of the H100 / H200
                 "decode_prefetch": t == 1 and cuda_decode_sm90.fits(h, i, k, 132)},
                label=f"fused_experts T{t} H{h} I{i} E{e} k{k} {dtype}")


@problem_generator("moe", "combine")
def _combine(gen, dtype, size):
    t, k, h = (5, 3, 40) if size == "small" else (4096, 8, 2048)
    return Case((_randn(gen, t, k, h, dtype=dtype), torch.rand(t, k, generator=gen)), {},
                {"expert_out": fmt(dtype)}, {"top_k": k}, label=f"combine {t}x{k}x{h}")
