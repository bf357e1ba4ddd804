"""The CUDA block-fp8 GEMM's tile-width choice (cuda_fp8_sm90.makespan / choose_config), on the
CPU: the wave model's figures for the DeepSeek-V3 shapes, the rule's use of the measured
one-pass costs (never a width without one), and the configs check_config refuses."""
from __future__ import annotations

import pytest

from tskernels.ops.gemm import cuda_fp8_sm90 as fp8

SMS = 132


def test_makespan_counts_the_partial_wave_of_n2112():
    # 8 tiles of 256 + a 64-wide column x 32 tile rows: 256 full tiles and 32 half-cost
    # narrow ones round-robin over 132 CTAs -> CTAs 0..23 run 1 + 1 + 0.5
    assert fp8.makespan(4096, 2112, 256, SMS) == pytest.approx(2.5)
    # 12 x 32 one-pass tiles of 176 at cost 1.0: 3 tiles of 176 / 256 on CTAs 0..119
    old = dict(fp8.ONE_PASS_COST)
    try:
        fp8.ONE_PASS_COST.clear()
        fp8.ONE_PASS_COST[176] = 1.0
        assert fp8.makespan(4096, 2112, 176, SMS) == pytest.approx(3 * 176 / 256)
        fp8.ONE_PASS_COST[176] = 1.2
        assert fp8.makespan(4096, 2112, 176, SMS) == pytest.approx(3 * 176 / 256 * 1.2)
    finally:
        fp8.ONE_PASS_COST.clear()
        fp8.ONE_PASS_COST.update(old)
    # whole waves of 256-wide tiles: 7168 = 28 x 256, 896 tiles -> CTAs 0..103 run 7
    assert fp8.makespan(4096, 7168, 256, SMS) == pytest.approx(7)


@pytest.mark.parametrize("costs,m,n,want", [
    ({}, 4096, 2112, 256),                      # no measured one-pass width: never chosen
    ({176: 1.0}, 4096, 2112, 176),              # 2.06 against 2.5
    ({176: 1.25}, 4096, 2112, 256),             # 2.58: no gain
    ({176: 1.0, 192: 1.0}, 4096, 2112, 176),    # 192: 11 x 32 = 352 tiles, 3 x 0.75 = 2.25
    ({176: 1.0}, 4096, 7168, 256),              # whole waves already: 7 vs 41 x 32 tiles
    ({176: 1.0}, 4096, 24576, 256),
])
def test_choose_config_takes_a_measured_width_only_where_it_pays(monkeypatch, costs, m, n, want):
    monkeypatch.setattr(fp8, "ONE_PASS_COST", dict(costs))
    cfg = fp8.choose_config(m, n, SMS)
    assert cfg["block_n"] == want
    fp8.check_config(cfg)  # whatever it picks fits shared memory and is a legal config
    if want != 256:
        assert cfg["stages"] == fp8.ONE_PASS_STAGES[want]


def test_every_one_pass_width_has_a_legal_stage_count():
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
