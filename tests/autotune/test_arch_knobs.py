"""Per-arch backend knobs (AMD CDNA: waves_per_eu, matrix_instr_nonkdim, kpack) in declared
spaces, the heuristic's arch defaults, and the tuner's bounded candidate draw."""
from __future__ import annotations

import pytest

from autotune import KernelSpace, Space, Target, Tables, tune_bucket
from autotune.declare import backend_options
from autotune.lookup import Lookup


def _ks(**kw):
    return KernelSpace(
        "demo.op.triton", Space(BLOCK=[32, 64, 128], num_warps=[4, 8]),
        key=lambda p: {"N": p["N"]}, heuristic=lambda p: {"BLOCK": 64, "num_warps": 4},
        prune=lambda cfg, p, t: "LDS" if t.vendor == "amd" and cfg["BLOCK"] > 64 else None,
        example={"N": 64}, **kw)


KNOBS = dict(arch_knobs={"amd": {"waves_per_eu": [0, 2], "matrix_instr_nonkdim": [16, 32]},
                         "gfx950": {"kpack": [1, 2]}},
             arch_defaults={"amd": {"waves_per_eu": 2, "matrix_instr_nonkdim": 16},
                            "gfx950": {"kpack": 2}})


def test_arch_knobs_only_on_their_vendor_and_arch():
    ks = _ks(**KNOBS)
    assert len(ks.space_for("nvidia", "sm_90")) == 6
    assert all(set(c) == {"BLOCK", "num_warps"} for c in ks.space_for("nvidia", "sm_90"))
    gfx942 = list(ks.space_for("amd", "gfx942"))
    assert len(gfx942) == 6 * 4 and all("kpack" not in c for c in gfx942)
    gfx950 = list(ks.space_for("amd", "gfx950"))
    assert len(gfx950) == 6 * 4 * 2 and {c["kpack"] for c in gfx950} == {1, 2}
    keep, pruned = ks.candidates({"N": 64}, Target.for_arch("gfx942"))
    assert len(keep) == 4 * 4 and all(p["reason"] == "LDS" for p in pruned)


def test_heuristic_gets_the_targets_defaults():
    ks = _ks(**KNOBS)
    p = {"N": 64}
    assert ks.heuristic_for(p, Target.for_arch("sm_90")) == {"BLOCK": 64, "num_warps": 4}
    h942 = ks.heuristic_for(p, Target.for_arch("gfx942"))
    assert h942 == {"BLOCK": 64, "num_warps": 4, "waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    h950 = ks.heuristic_for(p, Target.for_arch("gfx950"))
    assert h950["kpack"] == 2 and h950 in list(ks.space_for("amd", "gfx950"))
    assert backend_options(h950) == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}
    assert backend_options({"BLOCK": 64}) == {}


def test_lookup_heuristic_link_uses_arch_defaults(tmp_path):
    ks = _ks(**KNOBS)
    lk = Lookup(Tables(tmp_path / "user", tmp_path / "shipped"))
    c = lk.choose(ks, {"N": 64}, "amd-mi300x", record=False, target=Target.for_arch("gfx942"))
    assert c.link == "heuristic" and c.config["waves_per_eu"] == 2


def test_unknown_knob_is_rejected():
    with pytest.raises(ValueError, match="arch knobs"):
        _ks(arch_knobs={"amd": {"waves": [1]}})


class _Runner:
    def __init__(self):
        self.built = []

    def build(self, cfg):
        self.built.append(dict(cfg))
        return lambda: None

    def check(self, cfg):
        return True


def test_limit_draws_reproducibly_and_keeps_the_heuristic():
    ks = _ks(**KNOBS)
    tgt = Target.for_arch("gfx950")
    times = lambda fn: 1.0  # noqa: E731
    picks = []
    for _ in range(2):
        r = _Runner()
        res = tune_bucket(ks, {"N": 64}, r, timer=times, target=tgt, repeats=1, limit=5)
        assert len(res.candidates) == 5
        assert ks.heuristic_for({"N": 64}, tgt) in [c.config for c in res.candidates]
        assert res.heuristic_us == 1.0
        picks.append([c.config for c in res.candidates])
    assert picks[0] == picks[1]


def test_heuristic_outside_space_is_timed_and_may_win():
    ks = KernelSpace("demo.plan.triton", Space(BLOCK=[32, 64]), key=lambda p: {"N": p["N"]},
                     heuristic=lambda p: {}, example={"N": 1})

    class R(_Runner):
        def build(self, cfg):
            return lambda: cfg.get("BLOCK", 0)
    for times, pick in (({32: 5.0, 64: 3.0, 0: 4.0}, {"BLOCK": 64}),
                        ({32: 5.0, 64: 3.0, 0: 1.0}, {})):   # the plan's own choice fastest
        res = tune_bucket(ks, {"N": 1}, R(), timer=lambda fn: times[fn()], target=Target(),
                          repeats=1)
        assert res.pick == pick and res.heuristic == {} and res.heuristic_us == times[0]
        assert [c.config for c in res.candidates] == [{"BLOCK": 32}, {"BLOCK": 64}, {}]


def test_moe_experts_amd_knobs_reach_the_launch(monkeypatch):
    """moe.fused_experts declares its CDNA knobs in the space: the AMD candidates carry them,
    NVIDIA's do not, and `launch` splits a tuned AMD entry into tiles + launch options (the
    heuristic link: the arch's own table with CDNA_OPTIONS)."""
    import types

    import torch

    from tskernels import tuning
    from tskernels.ops.moe import _tune, triton_experts as te

    ks = _tune.EXPERTS
    assert not any("waves_per_eu" in c for c in ks.space_for("nvidia", "sm_90"))
    amd = list(ks.space_for("amd", "gfx942"))
    assert {c["matrix_instr_nonkdim"] for c in amd} == {16, 32}
    p = {"T": 300, "E": 32, "k": 8, "H": 1024, "I": 512, "w": "bf16"}
    monkeypatch.setattr(te, "cdna_arch", lambda dev: "gfx942")
    tuned = {**_tune._heuristic(p), "waves_per_eu": 1, "matrix_instr_nonkdim": 32}
    monkeypatch.setattr(tuning, "choice", lambda *a: types.SimpleNamespace(config=tuned,
                                                                          link="exact"))
    tiles, opts = _tune.launch(300, 1024, 512, 32, 8, False, torch.device("cuda"))
    assert tiles == te.Tiles(**_tune._heuristic(p)) and opts == {"waves_per_eu": 1,
                                                                  "matrix_instr_nonkdim": 32}
    heur = ks.heuristic_for(dict(p, arch="gfx942"), Target.for_arch("gfx942"))
    monkeypatch.setattr(tuning, "choice", lambda *a: types.SimpleNamespace(config=heur,
                                                                          link="heuristic"))
    tiles, opts = _tune.launch(300, 1024, 512, 32, 8, False, torch.device("cuda"))
    assert tiles == te.tiles_for(300, False, "gfx942")
    assert opts == {**te.CDNA_OPTIONS, "waves_per_eu": 0}


def test_mla_spaces_declare_amd_knobs_and_the_plan_takes_them():
    """mla.decode / mla.extend: AMD candidates carry the CDNA knobs (NVIDIA's do not), the
    heuristic's are 16x16 MFMA + the compiler's waves_per_eu, and MLAPlan accepts them as the
    tuner passes them (a candidate config is splatted into the plan)."""
    import torch

    from tskernels.ops.mla import _tune
    from tskernels.ops.mla.triton import MLAPlan

    for ks in (_tune.DECODE, _tune.EXTEND):
        assert not any("waves_per_eu" in c for c in ks.space_for("nvidia", "sm_90"))
        amd = list(ks.space_for("amd", "gfx950"))
        assert {c["waves_per_eu"] for c in amd} == {0, 1, 2}
        h = ks.heuristic_for({"H": 16, "kv": "bf16", "B": 1, "L": 4096, "T": 16},
                             Target.for_arch("gfx942"))
        assert backend_options(h) == {"waves_per_eu": 0, "matrix_instr_nonkdim": 16}
    pt = torch.zeros(1, 1, dtype=torch.int32)
    plan = MLAPlan(torch.tensor([0, 1], dtype=torch.int32), pt, torch.ones(1, dtype=torch.int32),
                   num_heads=16, kv_lora_rank=64, rope_dim=16, page_size=16, scale=0.1,
                   causal=False, waves_per_eu=2, matrix_instr_nonkdim=32)
    assert plan.launch_options == {}     # knobs are AMD-only: ignored off CDNA
