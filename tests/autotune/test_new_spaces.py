"""The spaces of extend, MLA, merge, store_kv, GEMM, MoE, sampling and GDN: their heuristic is
the kernel's own launch choice (so behaviour without a table is unchanged) and survives
pruning on the targets, pruning names why a config cannot run, buckets are what the lookup
and the capture file use, and the lookup chain falls back to the heuristic without tables."""
from __future__ import annotations

import pytest
import torch

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import Entry, Lookup, Tables, Target, bucket_str, spaces
from autotune.table import current_versions

SM90, GFX942, GFX950 = (Target.for_arch(a) for a in ("sm_90", "gfx942", "gfx950"))
NEW = ("attention.extend.triton", "attention.merge_states.triton", "attention.store_kv.triton",
       "mla.decode.triton", "mla.extend.triton", "gemm.mm.triton", "gemm.gemv.triton",
       "gemm.fp8_block_mm.triton", "gemm.fp8_stream.triton", "moe.fused_experts.triton",
       "sampling.greedy.triton", "gdn.decode_step.triton", "gdn.chunk_prefill.triton")


def test_every_new_kernel_declares_a_space_with_bench_shapes():
    missing = [k for k in NEW if k not in spaces()]
    assert not missing, missing
    for k in NEW:
        ks = spaces()[k]
        assert ks.runner is not None and ks.shapes, k
        for p in ks.shapes:                        # bench shapes: valid, heuristic kept
            keep, _ = ks.candidates(p, SM90)
            assert ks.heuristic_for(p, SM90) in keep or ks.heuristic(p) in keep, (k, p)


def _extend_cases():
    for d in (64, 128, 256):
        for q in ("bf16", "fp32"):
            for kv in ("bf16", "fp8") if q == "bf16" else ("fp32",):
                for n, pp in ((4096, 0), (512, 8192), (16384, 0)):
                    yield {"d": d, "g": 4, "q": q, "kv": kv, "causal": 1, "N": n, "P": pp}


@pytest.mark.parametrize("p", list(_extend_cases()), ids=str)
def test_extend_heuristic_is_launch_config_and_fits(p):
    from tskernels.ops.attention.triton_extend import SHORT_ROWS_KEYS, _launch_config, _mean_keys
    ks = spaces()["attention.extend.triton"]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[p["q"]]
    short = p["kv"] != "fp8" and _mean_keys([p["N"]], [p["N"] + p["P"]], 128) < SHORT_ROWS_KEYS
    want = _launch_config(p["d"], dt, True, short_rows=short)
    got = ks.heuristic(p)
    assert (got["block_m"], got["block_n"], got["num_warps"], got["num_stages"]) == want
    assert got in ks.candidates(p, SM90)[0]
    if p["q"] != "fp32":                            # CDNA: its own tiles + backend options
        for tgt in (GFX942, GFX950):
            h = ks.heuristic_for(dict(p, arch=tgt.arch), tgt)
            assert h["waves_per_eu"] == 2 and h["matrix_instr_nonkdim"] == 16
            assert h in ks.candidates(dict(p, arch=tgt.arch), tgt)[0], (tgt.arch, h)


@pytest.mark.parametrize("causal", [True, False])
def test_extend_tuning_reference_in_row_blocks_equals_whole(causal):
    """The extend runner's float64 reference, computed a block of rows at a time (the whole
    score matrix needs 64 GiB at N = 16384), equals the one-call reference to float64 rounding
    (the products are blocked differently: ~4e-16 apart)."""
    from tskernels.ops.attention._tune import extend_reference_rows
    from tskernels.testing.problems import paged_kv
    from tskernels_ref.attention import extend as ref_extend
    n, prefix, hq = 13, 9, 4
    kv = paged_kv([n + prefix], 4, 2, 16, torch.float64, "cpu")
    q = torch.randn(n, hq, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    whole = ref_extend(q, kv.k_cache, kv.v_cache, torch.tensor([0, n], dtype=torch.int32),
                       kv.page_table, kv.seq_lens, causal=causal, scale=0.25)
    for max_bytes in (1, 8 * hq * (n + prefix) * 4, 1 << 30):       # 1 row, 4 rows, all
        got = extend_reference_rows(q, kv.k_cache, kv.v_cache, kv.page_table, n, prefix,
                                    causal=causal, scale=0.25, max_bytes=max_bytes)
        torch.testing.assert_close(got, whole, rtol=1e-12, atol=1e-12)


def test_extend_prune_reasons():
    ks = spaces()["attention.extend.triton"]
    p = {"d": 256, "g": 4, "q": "bf16", "kv": "bf16", "causal": 1, "N": 4096, "P": 0}
    big = {"block_m": 128, "block_n": 128, "num_warps": 4, "num_stages": 3}
    assert "exceed" in spaces()["attention.extend.triton"].prune(big, p, SM90)
    assert "exceed" in ks.prune({"block_m": 128, "block_n": 64, "num_warps": 8,
                                 "num_stages": 2}, dict(p, d=128), GFX942)
    assert ks.bucket(dict(p, N=3000, P=5)) == {"d": 256, "g": 4, "q": "bf16", "kv": "bf16",
                                               "causal": 1, "N": 4096, "P": 8}


@pytest.mark.parametrize("H,kv", [(16, "bf16"), (16, "fp8"), (128, "bf16"), (128, "fp8")])
def test_mla_heuristic_is_plan_choice(H, kv):
    ks = spaces()["mla.decode.triton"]
    p = {"H": H, "kv": kv, "B": 64, "L": 4096, "nvidia": True}
    small = H <= 16
    bn, nw, ns = ((32, 4, 3) if kv == "fp8" else (128, 8, 2)) if small else (64, 8, 2)
    assert ks.heuristic(p) == {"block_n": bn, "num_warps": nw, "num_stages": ns, "num_splits": 0}
    assert ks.heuristic(p) in ks.candidates(p, SM90)[0]
    ext = spaces()["mla.extend.triton"]
    pe = dict(p, T=512)
    assert ext.heuristic(pe) in ext.candidates(pe, SM90)[0]
    assert "splits" in ks.prune(dict(ks.heuristic(p), num_splits=16), dict(p, L=1024), SM90)
    assert ext.bucket(pe) == {"H": H, "kv": kv, "B": 64, "L": 4096, "T": 512}


def test_mm_heuristic_keeps_enough_tiles():
    """Above M = 128 the bf16 table's 128 x 256 tile is taken only where it makes at least
    BIG_TILE_MIN_TILES tiles; otherwise the 64 x 128 row."""
    from tskernels.ops.gemm import triton_mm
    small, big = triton_mm.MM_CONFIGS[0][1], triton_mm.MM_CONFIGS[-1][1]
    assert triton_mm.BIG_TILE_MIN_TILES == 64
    assert triton_mm.mm_heuristic(100, 8192) == small  # M <= 128: the table's first row
    assert triton_mm.mm_heuristic(256, 4096) == small  # 2 x 16 = 32 big tiles
    assert triton_mm.mm_heuristic(512, 4096) == big    # 4 x 16 = 64
    assert triton_mm.mm_heuristic(256, 8192) == big    # 2 x 32 = 64
    assert triton_mm.mm_heuristic(4096, 4096) == big


def test_gemm_heuristics_are_the_kernel_tables():
    from tskernels.ops.gemm import triton_gemv, triton_mm
    mm, gemv = spaces()["gemm.mm.triton"], spaces()["gemm.gemv.triton"]
    f8, f8s = spaces()["gemm.fp8_block_mm.triton"], spaces()["gemm.fp8_stream.triton"]
    for m in (17, 128, 129, 4096, 16384):
        p = {"M": m, "N": 4096, "K": 4096, "dtype": "bf16"}
        assert mm.heuristic(p) == triton_mm.mm_heuristic(m, 4096)
        assert mm.heuristic(p) in mm.candidates(p, SM90)[0]
        assert f8.heuristic(p) == triton_mm.pick(triton_mm.FP8_CONFIGS, m)
        assert f8.heuristic(p) in f8.candidates(p, SM90)[0]
    for m in (1, 16, 32, 64):
        p = {"M": m, "N": 7168, "K": 2048}
        mp = triton_gemv.mpad(m)
        assert f8s.heuristic(p) == triton_gemv.STREAM_CONFIGS[("fp8", mp)]
        assert f8s.heuristic(p) in f8s.candidates(p, SM90)[0]
        if m <= 16:
            assert gemv.heuristic(p) == triton_gemv.STREAM_CONFIGS[("16bit", 16)]
            assert gemv.heuristic(dict(p, dtype="bf16")) in gemv.candidates(dict(p, dtype="bf16"),
                                                                            SM90)[0]
    # every fp8 config keeps BK = 128 and BN dividing 128 (the scale blocks)
    assert all(c["BK"] == 128 and 128 % c["BN"] == 0 for c in f8.space_for() )
    big = {"BM": 128, "BN": 256, "BK": 128, "GROUP_M": 8, "num_stages": 5, "num_warps": 8}
    assert "exceed" in mm.prune(big, {"M": 4096, "N": 4096, "K": 4096}, SM90)
    assert "registers" in mm.prune(dict(big, BK=32, num_stages=2, num_warps=4),
                                   {"M": 4096, "N": 4096, "K": 4096}, SM90)
    assert mm.bucket({"M": 3000, "N": 6144, "K": 4096, "dtype": "bf16"}) == \
        {"M": 4096, "N": 8192, "K": 4096, "dtype": "bf16"}
    assert gemv.bucket({"M": 3, "N": 4096, "K": 4096})["M"] == 16


@pytest.mark.parametrize("T", [1, 16, 64, 512, 2048, 8192])
@pytest.mark.parametrize("w", ["bf16", "fp8"])
def test_moe_heuristic_is_tiles_for(T, w):
    from dataclasses import asdict

    from tskernels.ops.moe.triton_experts import tiles_for
    ks = spaces()["moe.fused_experts.triton"]
    p = {"T": T, "E": 128, "k": 8, "H": 2048, "I": 768, "w": w}
    assert ks.heuristic(p) == asdict(tiles_for(T, w == "fp8"))
    assert ks.heuristic(p) in ks.candidates(p, SM90)[0]
    for arch in ("gfx942", "gfx950"):
        pa = dict(p, arch=arch)
        assert ks.heuristic(pa) == asdict(tiles_for(T, w == "fp8", arch))
        h = ks.heuristic_for(pa, Target.for_arch(arch))   # + the AMD knobs' defaults
        assert h == {**asdict(tiles_for(T, w == "fp8", arch)), "waves_per_eu": 0,
                     "matrix_instr_nonkdim": 16}
        assert h in ks.candidates(pa, Target.for_arch(arch))[0]
    if w == "fp8":
        bad = dict(ks.heuristic(p), up_k=64)
        assert "fp8" in ks.prune(bad, p, SM90)


@pytest.mark.parametrize("T", [2048, 4096, 8192])
def test_shipped_h200_moe_prefill_takes_its_own_tiles(T):
    """The shipped H200 table's one MoE entry (T = 1024) is that bucket's heuristic: it must
    not replace the 128-row tiles of the larger prefill buckets (session 23: it did, and the
    T = 8192 layer ran 15 % slower with 64-row tiles)."""
    from dataclasses import asdict

    from autotune import choose
    from tskernels.ops.moe.triton_experts import tiles_for
    ks = spaces()["moe.fused_experts.triton"]
    c = choose(ks, {"T": T, "E": 128, "k": 8, "H": 2048, "I": 768, "w": "bf16"},
               "nvidia-h200", target=SM90)
    assert c.config == asdict(tiles_for(T, False))
    # T = 4096 / 8192 are pinned since (s23_lookup_ab.json); without those entries the
    # own-heuristic rule gives the same tiles (test_tables.py tests the rule itself)
    assert c.link == ("nearest-bucket" if T == 2048 else "exact")


def test_store_merge_greedy_gdn_heuristics_and_pruning():
    store = spaces()["attention.store_kv.triton"]
    p = {"T": 64, "H": 8, "D": 128, "kv": "bf16", "dtype": "bf16"}
    assert store.heuristic(p) == {"block_h": 8, "num_warps": 4}      # triton_store's rule
    assert "wider than the heads" in store.prune({"block_h": 16, "num_warps": 4}, p, SM90)
    merge = spaces()["attention.merge_states.triton"]
    assert merge.heuristic({}) == {"num_warps": 1}
    greedy = spaces()["sampling.greedy.triton"]
    pg = {"B": 64, "V": 128256, "dtype": "bf16"}
    assert greedy.heuristic(pg) == {"chunk": 0, "block": 2048, "num_warps": 8}
    assert "wider than the chunk" in greedy.prune({"chunk": 2048, "block": 4096,
                                                   "num_warps": 8}, pg, SM90)
    dec = spaces()["gdn.decode_step.triton"]
    pd = {"B": 64, "HK": 16, "HV": 32, "K": 128, "V": 128, "dtype": "bf16"}
    assert dec.heuristic(pd) == {"block_v": 0, "num_warps": 0}        # the kernel decides
    assert "divide" in dec.prune({"block_v": 64, "num_warps": 0}, dict(pd, V=96), SM90)
    from tskernels.ops.gdn._tune import nonzero
    assert nonzero({"block_v": 0, "num_warps": 8}) == {"num_warps": 8}


@pytest.mark.parametrize("kernel", NEW)
def test_lookup_chain_heuristic_then_nearest(kernel, tmp_path):
    """No table: the heuristic link with the kernel's config; an entry one bucket away: the
    nearest-bucket link supplies it (when the space has another valid config to store)."""
    ks = spaces()[kernel]
    p = dict(ks.shapes[0])
    look = Lookup(Tables(tmp_path / "user", tmp_path / "shipped"))
    c = look.choose(ks, p, "nvidia-h200", record=False, target=SM90)
    assert c.link == "heuristic" and c.config == ks.heuristic_for(p, SM90)
    keep, _ = ks.candidates(p, SM90)
    other = next((cfg for cfg in keep if cfg != c.config), None)
    ints = [k for k, v in ks.bucket(p).items() if isinstance(v, int) and k not in ks.exact]
    if other is None or not ints:
        return
    far = dict(ks.bucket(p))
    far[ints[0]] = far[ints[0]] * 2 or 1
    user = look.tables.table(look.tables.user, "nvidia-h200")
    user.put(Entry(kernel, bucket_str(far), other, us=1.0, source_hash=ks.source_hash(),
                   versions=dict(current_versions())))
    user.save()
    look.invalidate()
    c2 = look.choose(ks, p, "nvidia-h200", record=False, target=SM90)
    assert c2.link in ("nearest-bucket", "heuristic")
    if c2.link == "nearest-bucket":
        assert c2.config == other
    else:                                  # the stored config does not fit this problem
        assert any("does not fit" in s for s in c2.skipped)
