"""Tuning spaces of the Triton decode, extend, merge_states, store_kv and rope_store_kv kernels
(see autotune.declare).

Each kernel keeps its own launch heuristic as the space's heuristic, so without a table entry
a launch is what it was before the space existed. The kernel modules are imported lazily (they
import this one). Bucket dimensions double as a problem: `python -m autotune tune --from-capture`
rebuilds inputs from a captured bucket alone.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from autotune import KernelSpace, Space, declare, jit_source, pow2_bucket

from ... import tuning

_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4, "float8_e4m3fn": 1, "bfloat16": 2,
          "float16": 2, "float32": 4}
_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def fmt(dtype: torch.dtype) -> str:
    """Short dtype names of bucket dimensions ('bf16', 'fp8', ...)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            torch.float8_e4m3fn: "fp8"}.get(dtype, str(dtype).removeprefix("torch."))


def _pow2_or_0(n: int) -> int:
    return 0 if n <= 0 else pow2_bucket(n)


def _test_dtype(name: str, device) -> torch.dtype:
    """The dtype a runner builds: bf16 as served, fp16 where Triton only interprets (bf16 is
    not exact there)."""
    dt = _TORCH.get(name, torch.bfloat16)
    return torch.float16 if dt == torch.bfloat16 and torch.device(device).type != "cuda" else dt


# ---- attention.decode ------------------------------------------------------------------------
DECODE_KERNEL = "attention.decode.triton"


def decode_problem(head_dim: int, kv: str, group: int, batch_x_kv_heads: int,
                 max_seq_len: int) -> dict:
    return {"d": head_dim, "kv": kv, "g": group, "bh": batch_x_kv_heads, "L": max_seq_len}


def _decode_prune(cfg: dict, p, target) -> str | None:
    block_d = max(16, 1 << (p["d"] - 1).bit_length())
    kv_bytes = {"fp8": 1, "fp32": 4}.get(p["kv"], 2)
    smem = cfg["num_stages"] * cfg["block_n"] * block_d * 2 * kv_bytes
    if smem > target.smem_bytes:
        return f"{smem} B of K/V stages exceed {target.smem_bytes} B"
    if cfg["num_splits"] > 1 and cfg["num_splits"] * cfg["block_n"] > p["L"]:
        return "more splits than key tiles"
    if p["kv"] == "fp8" and cfg["block_n"] < 32:
        return "e4m3 dots need >= 32 keys per tile"
    return None


def _decode_runner(p, device):
    from tskernels_ref.attention import decode as ref_decode

    from ...testing.problems import paged_kv
    from .triton_decode import DecodePlan
    hkv = 8 if p["bh"] >= 8 else p["bh"]
    batch, hq = max(1, p["bh"] // hkv), hkv * p["g"]
    fp8 = p["kv"] == "fp8"
    # bf16 as served; fp16 where Triton only interprets (bf16 is not exact there)
    dt = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float16
    kv = paged_kv([p["L"]] * batch, 16, hkv, p["d"], dt, device,
                  kv_dtype=torch.float8_e4m3fn if fp8 else None, permute=True)
    q = torch.randn(batch, hq, p["d"], device=device, dtype=dt)
    scales = dict(k_scale=kv.k_scale, v_scale=kv.v_scale) if fp8 else {}

    def launch(cfg, _inputs):
        plan = DecodePlan(kv.page_table, kv.seq_lens, num_q_heads=hq, num_kv_heads=hkv,
                          head_dim=p["d"], page_size=16, q_dtype=q.dtype, kv_dtype=kv.k_cache.dtype,
                          scale=p["d"] ** -0.5, max_seq_len=p["L"], **cfg)
        return plan.run(q, kv.k_cache, kv.v_cache, **scales)

    def reference(_inputs):
        return ref_decode(q.double(), kv.k_cache.double() if not fp8 else kv.k_cache, kv.v_cache.double()
                          if not fp8 else kv.v_cache, kv.page_table, kv.seq_lens, **scales)
    return tuning.TensorRunner(lambda d: (), launch, reference, device, rotate=False)


# Launch configs of the decode kernel, tuned per bucket of (head dim, KV format, GQA group,
# batch x KV heads, longest sequence); {} leaves every choice to the plan (split policy and
# _launch_config) when no table entry applies.
DECODE = declare(KernelSpace(
    DECODE_KERNEL,
    Space(block_n=[16, 32, 64, 128], num_warps=[2, 4, 8], num_stages=[2, 3, 4],
          num_splits=[1, 2, 4, 8, 16, 32]),
    key=lambda p: {"d": p["d"], "kv": p["kv"], "g": p["g"], "bh": pow2_bucket(p["bh"]),
                   "L": pow2_bucket(p["L"])},
    heuristic=lambda p: {}, prune=_decode_prune,
    source=lambda: jit_source(__import__(__package__ + ".triton_decode",
                                         fromlist=["_"])._decode_kernel),
    arch_knobs={"amd": {"waves_per_eu": [2, 3], "matrix_instr_nonkdim": [16]}},
    runner=_decode_runner, parse=tuning.parse_shape, exact=("d", "g"),
    example={"d": 128, "kv": "bf16", "g": 4, "bh": 512, "L": 4096}))


# ---- attention.extend ------------------------------------------------------------------------
def extend_problem(head_dim, group, q_dtype, kv_dtype, causal, counts, lens, short_rows,
                   arch=None) -> dict:
    n = sum(counts)
    prefix = sum(L - c for c, L in zip(counts, lens)) // max(1, len(counts))
    return {"d": head_dim, "g": group, "q": fmt(q_dtype), "kv": fmt(kv_dtype),
            "causal": int(bool(causal)), "N": n, "P": prefix, "short": bool(short_rows),
            "arch": arch}


def _extend_heuristic(p: Mapping) -> dict:
    from .triton_extend import SHORT_ROWS_KEYS, _launch_config, _mean_keys
    short = p.get("short")
    if short is None:                      # a problem rebuilt from its bucket
        short = _BYTES[p["kv"]] >= 2 and bool(p["causal"]) and \
            _mean_keys([p["N"]], [p["N"] + p["P"]], 128) < SHORT_ROWS_KEYS
    bm, bn, nw, ns = _launch_config(p["d"], _TORCH.get(p["q"], torch.bfloat16), True,
                                    short_rows=short, arch=p.get("arch"))
    return {"block_m": bm, "block_n": bn, "num_warps": nw, "num_stages": ns}


def _extend_prune(cfg, p, target) -> str | None:
    block_d = max(16, 1 << (p["d"] - 1).bit_length())
    qb, kb = _BYTES[p["q"]], max(_BYTES[p["kv"]], 2)   # fp8 tiles are converted to 16-bit
    smem = cfg["block_m"] * block_d * qb + cfg["num_stages"] * 2 * cfg["block_n"] * block_d * kb
    if smem > target.smem_bytes:
        return f"{smem} B of Q + K/V stages exceed {target.smem_bytes} B"
    # fp32 accumulator [block_m x block_d] + logits [block_m x block_n] per thread
    threads = cfg["num_warps"] * target.warp_size
    regs = (cfg["block_m"] * block_d + cfg["block_m"] * cfg["block_n"]) // threads
    if regs > 192:
        return f"~{regs} fp32 accumulator registers per thread (spills)"
    if p["q"] == "fp32" and cfg["block_m"] * cfg["block_n"] > 1024:
        return "fp32 (IEEE) dots: tiles above 1024 logits spill"
    return None


def _extend_runner(p, device):
    from ...testing.problems import paged_kv
    from .triton_extend import ExtendPlan
    d, g, N, P = p["d"], p["g"], p["N"], p.get("P", 0)
    hkv = 8 if torch.device(device).type == "cuda" else 1
    dt = _test_dtype(p["q"], device)
    fp8 = p["kv"] == "fp8"
    kv = paged_kv([N + P], 16, hkv, d, dt, device, kv_dtype=torch.float8_e4m3fn if fp8 else None)
    q = torch.randn(N, hkv * g, d, device=device, dtype=dt)
    qo = torch.tensor([0, N], dtype=torch.int32, device=device)
    scales = dict(k_scale=kv.k_scale, v_scale=kv.v_scale) if fp8 else {}

    def launch(cfg, _inputs):
        plan = ExtendPlan(qo, kv.page_table, kv.seq_lens, num_q_heads=hkv * g, num_kv_heads=hkv,
                          head_dim=d, page_size=16, q_dtype=q.dtype, kv_dtype=kv.k_cache.dtype,
                          scale=d ** -0.5, causal=bool(p["causal"]),
                          config=(cfg["block_m"], cfg["block_n"], cfg["num_warps"],
                                  cfg["num_stages"]))
        plan.launch_options.update(tuning.backend_options(cfg))
        return plan.run(q, kv.k_cache, kv.v_cache, **scales)

    def reference(_inputs):
        kc, vc = (kv.k_cache, kv.v_cache) if fp8 else (kv.k_cache.double(), kv.v_cache.double())
        return extend_reference_rows(q.double(), kc, vc, kv.page_table, N, P,
                                     causal=bool(p["causal"]), scale=d ** -0.5, **scales)
    return tuning.TensorRunner(lambda dev: (), launch, reference, device, rotate=False)


REF_SCORE_BYTES = 2 << 30


def extend_reference_rows(q, k_cache, v_cache, page_table, n, prefix, *, causal,
                          max_bytes=None, **kw):
    """The float64 reference of one request's n new rows over `prefix` cached tokens, computed
    a block of rows at a time so its score matrix stays under max_bytes (REF_SCORE_BYTES): the
    whole [Hq, n, n + prefix] float64 matrix is 64 GiB at n = 16384, more than the H200 holds.
    A causal block of rows a..b-1 is the request cut at prefix + b tokens (its rows are then
    the last ones, at the same positions); without the mask positions do not matter."""
    from tskernels_ref.attention import extend as ref_extend
    dev = q.device
    max_bytes = REF_SCORE_BYTES if max_bytes is None else max_bytes
    rows = max(1, max_bytes // (8 * q.shape[1] * (n + prefix)))
    out = []
    for a in range(0, n, rows):
        b = min(n, a + rows)
        total = prefix + b if causal else prefix + n
        out.append(ref_extend(q[a:b], k_cache, v_cache,
                              torch.tensor([0, b - a], dtype=torch.int32, device=dev), page_table,
                              torch.tensor([total], dtype=torch.int32, device=dev),
                              causal=causal, **kw))
    return torch.cat(out)


EXTEND = declare(KernelSpace(
    "attention.extend.triton",
    Space(block_m=[16, 32, 64, 128], block_n=[16, 32, 64, 128], num_warps=[4, 8],
          num_stages=[1, 2, 3]),
    key=lambda p: {"d": p["d"], "g": p["g"], "q": p["q"], "kv": p["kv"], "causal": p["causal"],
                   "N": pow2_bucket(p["N"]), "P": _pow2_or_0(p.get("P", 0))},
    heuristic=_extend_heuristic, prune=_extend_prune,
    source=lambda: jit_source(__import__(__package__ + ".triton_extend",
                                         fromlist=["_"])._extend_kernel),
    runner=_extend_runner, parse=tuning.parse_shape, exact=("d", "g", "causal"),
    # AMD CDNA: the launch options of triton_extend.CDNA_OPTIONS; wider choices are the
    # hardware issue's to fill in once a CDNA GPU has run them
    arch_knobs={"amd": {"waves_per_eu": [2], "matrix_instr_nonkdim": [16]}},
    arch_defaults={"amd": {"waves_per_eu": 2, "matrix_instr_nonkdim": 16}},
    example={"d": 128, "g": 4, "q": "bf16", "kv": "bf16", "causal": 1, "N": 4096, "P": 0},
    shapes=tuple({"d": 128, "g": 4, "q": "bf16", "kv": "bf16", "causal": 1, "N": n, "P": pp}
                 for n, pp in ((4096, 0), (1024, 16384)))))


def extend_choice(device, **problem):
    """The extend launch config through the lookup chain (a `Choice`: .config, .link)."""
    return tuning.choice(EXTEND, extend_problem(**problem), device)


# ---- attention.merge_states ------------------------------------------------------------------
def _merge_runner(p, device):
    from tskernels_ref.attention import merge_states as ref_merge

    from .triton_merge import _merge
    N, H, D = p["N"], p["H"], p["D"]
    dt = _test_dtype(p.get("dtype", "bf16"), device)

    def make(dev):
        return (torch.randn(N, H, D, device=dev, dtype=dt), torch.randn(N, H, device=dev),
                torch.randn(N, H, D, device=dev, dtype=dt), torch.randn(N, H, device=dev))
    return tuning.TensorRunner(make, lambda cfg, x: _merge(*x, cfg)[0],
                               lambda x: ref_merge(*(t.double() for t in x))[0], device)


MERGE = declare(KernelSpace(
    "attention.merge_states.triton", Space(num_warps=[1, 2, 4, 8]),
    key=lambda p: {"D": pow2_bucket(p["D"]), "H": pow2_bucket(p["H"]),
                   "N": tuning.rows_bucket(p["N"]), "dtype": p.get("dtype", "bf16")},
    heuristic=lambda p: {"num_warps": 1},
    prune=lambda cfg, p, t: "more threads than columns"
    if cfg["num_warps"] * t.warp_size > max(16, pow2_bucket(p["D"])) * 2 else None,
    source=lambda: jit_source(__import__(__package__ + ".triton_merge",
                                         fromlist=["_"])._merge_two_kernel),
    runner=_merge_runner, parse=tuning.parse_shape,
    example={"N": 4, "H": 8, "D": 128, "dtype": "bf16"},
    shapes=({"N": 64, "H": 32, "D": 128, "dtype": "bf16"},
            {"N": 4096, "H": 32, "D": 128, "dtype": "bf16"})))


def merge_config(N: int, H: int, D: int, dtype: torch.dtype, device) -> dict:
    return tuning.config(MERGE, {"N": N, "H": H, "D": D, "dtype": fmt(dtype)}, device)


# ---- attention.store_kv ----------------------------------------------------------------------
def _store_heuristic(p: Mapping) -> dict:
    block_d = pow2_bucket(p["D"])
    return {"block_h": max(1, min(pow2_bucket(p["H"]), 4096 // block_d)), "num_warps": 4}


def _store_prune(cfg, p, target) -> str | None:
    if cfg["block_h"] > pow2_bucket(p["H"]):
        return "a head block wider than the heads"
    tile = cfg["block_h"] * pow2_bucket(p["D"])
    if tile > 8192:
        return f"a {tile}-element tile per program"
    if cfg["num_warps"] * target.warp_size > tile:
        return "more threads than elements"
    return None


def _store_runner(p, device):
    from tskernels_ref.attention import store_kv as ref_store

    from .triton_store import _store
    T, H, D = p["T"], p["H"], p["D"]
    dt = _test_dtype(p.get("dtype", "bf16"), device)
    fp8 = p["kv"] == "fp8"
    cdt = torch.float8_e4m3fn if fp8 else dt
    pages = -(-T // 16) + 1
    slots = torch.randperm(pages * 16, device=device)[:T].to(torch.int64)
    ks = torch.tensor([0.05], device=device) if fp8 else None

    def make(dev):
        return (torch.randn(T, H, D, device=dev, dtype=dt), torch.randn(T, H, D, device=dev, dtype=dt),
                torch.zeros(pages, 16, H, D, device=dev, dtype=cdt),
                torch.zeros(pages, 16, H, D, device=dev, dtype=cdt))

    def launch(cfg, x):
        _store(x[0], x[1], x[2], x[3], slots, ks, ks, cfg)
        return x[2], x[3]

    def reference(x):
        kc, vc = x[2].clone(), x[3].clone()
        ref_store(x[0], x[1], kc, vc, slots, ks, ks)
        return kc, vc
    return tuning.TensorRunner(make, launch, reference, device)


STORE = declare(KernelSpace(
    "attention.store_kv.triton",
    Space(block_h=[1, 2, 4, 8, 16, 32], num_warps=[1, 2, 4, 8]),
    key=lambda p: {"H": p["H"], "D": p["D"], "T": tuning.rows_bucket(p["T"]),
                   "kv": p["kv"], "dtype": p.get("dtype", "bf16")},
    heuristic=_store_heuristic, prune=_store_prune,
    source=lambda: jit_source(__import__(__package__ + ".triton_store",
                                         fromlist=["_"])._store_kv_kernel),
    runner=_store_runner, parse=tuning.parse_shape, exact=("H", "D"),
    example={"T": 16, "H": 8, "D": 128, "kv": "bf16", "dtype": "bf16"},
    shapes=tuple({"T": t, "H": 8, "D": 128, "kv": kv, "dtype": "bf16"}
                 for t in (64, 4096) for kv in ("bf16", "fp8"))))


def store_config(T: int, H: int, D: int, k_dtype: torch.dtype, cache_dtype: torch.dtype,
                 device) -> dict:
    return tuning.config(STORE, {"T": T, "H": H, "D": D, "kv": fmt(cache_dtype),
                                 "dtype": fmt(k_dtype)}, device)


# ---- attention.rope_store_kv -----------------------------------------------------------------
def _rope_store_heuristic(p: Mapping) -> dict:
    return {"heads": min(16, pow2_bucket(max(p["Hq"], p["Hkv"]))), "num_warps": 4}


def _rope_store_prune(cfg, p, target) -> str | None:
    if cfg["heads"] > 2 * pow2_bucket(max(p["Hq"], p["Hkv"])):
        return "more heads per program than twice the heads"
    if cfg["num_warps"] * target.warp_size > cfg["heads"] * pow2_bucket(p["D"]):
        return "more threads than elements per program"
    return None


def _rope_store_runner(p, device):
    from tskernels_ref.attention import rope_store_kv as ref_op
    from tskernels_ref.rope import cos_sin_cache

    from .triton_rope_store import _launch
    T, Hq, Hkv, D = p["T"], p["Hq"], p["Hkv"], p["D"]
    dt = _test_dtype(p.get("dtype", "bf16"), device)
    norm = bool(p.get("norm", 0))
    table = cos_sin_cache(4096, D).to(device)
    pos = torch.randint(0, 4096, (T,), device=device)
    pages = -(-T // 16) + 1
    slots = torch.randperm(pages * 16, device=device)[:T].to(torch.int64)
    w = (torch.rand(2, D, device=device) + 0.5).to(dt) if norm else (None, None)

    def make(dev):
        return (torch.randn(T, Hq, D, device=dev, dtype=dt),
                torch.randn(T, Hkv, D, device=dev, dtype=dt),
                torch.randn(T, Hkv, D, device=dev, dtype=dt),
                torch.zeros(pages, 16, Hkv, D, device=dev, dtype=dt),
                torch.zeros(pages, 16, Hkv, D, device=dev, dtype=dt))

    def launch(cfg, x):
        qo = _launch(x[0], x[1], x[2], pos, table, x[3], x[4], slots, False, w[0], w[1], 1e-6,
                     cfg)
        return qo, x[3], x[4]

    def reference(x):
        kc, vc = x[3].clone(), x[4].clone()
        qo = ref_op(x[0], x[1], x[2], pos, table, kc, vc, slots, q_norm_weight=w[0],
                    k_norm_weight=w[1])
        return qo, kc, vc
    return tuning.TensorRunner(make, launch, reference, device)


ROPE_STORE = declare(KernelSpace(
    "attention.rope_store_kv.triton",
    Space(heads=[1, 2, 4, 8, 16, 32], num_warps=[1, 2, 4, 8]),
    key=lambda p: {"Hq": p["Hq"], "Hkv": p["Hkv"], "D": p["D"],
                   "T": tuning.rows_bucket(p["T"]), "dtype": p.get("dtype", "bf16")},
    heuristic=_rope_store_heuristic, prune=_rope_store_prune,
    source=lambda: jit_source(__import__(__package__ + ".triton_rope_store",
                                         fromlist=["_"])._rope_store_kv_kernel),
    runner=_rope_store_runner, parse=tuning.parse_shape, exact=("Hq", "Hkv", "D"),
    example={"T": 1, "Hq": 32, "Hkv": 8, "D": 128, "dtype": "bf16"},
    shapes=tuple({"T": t, "Hq": 32, "Hkv": hkv, "D": 128, "dtype": "bf16"}
                 for t in (1, 64) for hkv in (4, 8))))


def rope_store_config(T: int, Hq: int, Hkv: int, D: int, dtype: torch.dtype, device) -> dict:
    return tuning.config(ROPE_STORE, {"T": T, "Hq": Hq, "Hkv": Hkv, "D": D, "dtype": fmt(dtype)},
                         device)
