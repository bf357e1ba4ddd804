"""The CUDA block-fp8 GEMM's tile-width choice (cuda_fp8_sm90.makespan / choose_config), on the
CPU: the wave model's figures, the rule's picks on the DeepSeek-V3 shapes as measured (session
29, H100: benchmarks/RESULTS.md), its use of the cost table only (never a width without an
entry), and the configs check_config refuses."""
from __future__ import annotations

import pytest
import torch

from tskernels.ops.gemm import cuda_fp8_sm90 as fp8

SMS = 132


@pytest.fixture(autouse=True)
def _fresh_choice_cache():
    """choose_config caches per shape; tests that patch its tables must not see old picks."""
    fp8.choose_config.cache_clear()
    yield
    fp8.choose_config.cache_clear()


def test_makespan_counts_the_partial_wave_of_n2112():
    # K = 7168: 56 blocks. 8 tiles of 256 + a 64-wide column x 32 tile rows: 256 full tiles
    # and 32 half-cost narrow ones round-robin over 132 CTAs -> CTAs 0..23 run 56 + 56 + 28
    assert fp8.makespan(4096, 2112, 7168, 256, SMS) == pytest.approx(140)
    # 12 x 32 one-pass tiles of 176: 3 tiles on CTAs 0..119, each 56 x 176 / 256 x c + f
    assert fp8.makespan(4096, 2112, 7168, 176, SMS, cost=(1.0, 0.0)) == \
        pytest.approx(3 * 56 * 176 / 256)
    assert fp8.makespan(4096, 2112, 7168, 176, SMS, cost=(1.2, 2.0)) == \
        pytest.approx(3 * (56 * 176 / 256 * 1.2 + 2))
    # whole waves of 256-wide tiles: 7168 = 28 x 256, 896 tiles -> CTAs 0..103 run 7 x 16
    assert fp8.makespan(4096, 7168, 2048, 256, SMS) == pytest.approx(7 * 16)
    assert fp8.makespan(0, 7168, 2048, 256, SMS) == 0.0


# the measured best (or shipped-equal) width per shape, H100, session 29
@pytest.mark.parametrize("m,n,k,want", [
    (4096, 2112, 7168, 176), (2048, 2112, 7168, 144), (1024, 2112, 7168, 144),
    (4096, 7168, 2048, 256), (4096, 24576, 1536, 256), (4096, 7168, 16384, 256),
    (2048, 7168, 16384, 256), (1024, 7168, 2048, 256), (8192, 8192, 8192, 256),
])
def test_shipped_costs_pick_what_was_measured_faster(m, n, k, want):
    cfg = fp8.choose_config(m, n, k, SMS)
    assert cfg["block_n"] == want
    fp8.check_config(cfg)  # whatever it picks fits shared memory and is a legal config
    if want != 256:
        assert cfg["stages"] == fp8.ONE_PASS_STAGES[want]
    else:
        assert cfg == fp8.CONFIG


def test_a_width_without_a_measured_cost_is_never_chosen(monkeypatch):
    monkeypatch.setattr(fp8, "ONE_PASS_COST", {})
    assert fp8.choose_config(4096, 2112, 7168, SMS) == fp8.CONFIG
    monkeypatch.setattr(fp8, "ONE_PASS_COST", {192: (1.0, 0.0)})
    fp8.choose_config.cache_clear()
    assert fp8.choose_config(4096, 2112, 7168, SMS)["block_n"] == 192
    # whole 256-wide columns: never a one-pass width, whatever the model says
    monkeypatch.setattr(fp8, "ONE_PASS_COST", {176: (0.5, 0.0)})
    fp8.choose_config.cache_clear()
    assert fp8.choose_config(2048, 7168, 16384, SMS) == fp8.CONFIG


def test_every_one_pass_width_has_a_legal_stage_count():
    assert set(fp8.ONE_PASS_COST) <= set(fp8.ONE_PASS) == set(fp8.ONE_PASS_STAGES)
    for bn in fp8.ONE_PASS:
        cfg = fp8.check_config({"block_n": bn, "stages": fp8.ONE_PASS_STAGES[bn]})
        assert fp8.smem_bytes(bn, cfg["stages"], cfg["cbuf"]) <= fp8.SMEM_LIMIT


@pytest.mark.parametrize("bad", [
    {"block_n": 200}, {"block_n": 176, "cluster": 2}, {"block_n": 176, "pipe": True},
    {"block_n": 192, "stages": 5},  # 237.6 KB of shared memory
])
def test_check_config_refuses(bad):
    with pytest.raises(ValueError, match="CUDA fp8 GEMM"):
        fp8.check_config(bad)


def test_empty_problems_return_before_the_tile_choice(monkeypatch):
    """M = 0 / N = 0 return the (empty) output and K = 0 zeros, without the wave model (which
    has no tiles to place: the GPU tier's zero-size test failed there in session 29) or a
    launch; a bad config is still refused."""
    def boom(*a, **k):
        raise AssertionError("the tile choice ran on an empty problem")
    monkeypatch.setattr(fp8, "choose_config", boom)
    e4 = torch.float8_e4m3fn
    a, b = torch.zeros(3, 256, dtype=e4), torch.zeros(256, 256, dtype=e4)
    sa, sb = torch.ones(3, 2), torch.ones(2, 2)
    out = torch.full((0, 256), float("nan"), dtype=torch.bfloat16)
    assert fp8.run(a[:0], sa[:0], b, sb, out) is out
    out = torch.full((3, 256), float("nan"), dtype=torch.bfloat16)
    assert torch.equal(fp8.run(a[:, :0], sa[:, :0], b[:, :0], sb[:, :0], out),
                       torch.zeros(3, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="CUDA fp8 GEMM"):
        fp8.run(a[:0], sa[:0], b, sb, torch.empty(0, 256), {"block_n": 200})
