"""AMD CDNA launch configs (heuristic, per arch; no AMD GPU ran them): the attention extend
kernel's gfx942 / gfx950 tiles differ from the NVIDIA ones where the hardware differs (64 KB vs
160 KB of LDS, wave 64), fit the arch's LDS, and are the ones the compile matrix builds for
those archs (with the AMD launch options), where it must show MFMA and no scratch
(test_compile_matrix.py)."""
from __future__ import annotations

import torch

from autotune.declare import Target
from tskernels.ops.attention import triton_extend as te


def test_extend_cdna_configs_per_arch():
    nvidia = te._launch_config(128, torch.bfloat16, True)
    assert te._launch_config(128, torch.bfloat16, True, arch=None) == nvidia
    for arch, stages in (("gfx942", 1), ("gfx950", 2)):
        for d in (64, 128, 256):
            bm, bn, nw, ns = te._launch_config(d, torch.bfloat16, True, arch=arch)
            assert ns == stages and nw in (4, 8)
            kv_stage = bn * max(16, 1 << (d - 1).bit_length()) * 2 * 2  # K + V, 16-bit
            assert ns * kv_stage <= Target.for_arch(arch).smem_bytes // 2, (arch, d)
        assert te._launch_config(128, torch.bfloat16, True, arch=arch) != nvidia
        # fp32 (the IEEE accuracy path) keeps its FMA tiles everywhere
        assert te._launch_config(128, torch.float32, True, arch=arch) == \
            te._launch_config(128, torch.float32, True)
    assert te.CDNA_OPTIONS == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16}


def test_extend_compile_cases_use_the_cdna_configs():
    cases = te._cases()
    for arch in te.CDNA_ARCHS:
        bm, bn, nw, ns = te._cdna_config(arch, 128)
        mine = [c for c in cases if c.targets == (arch,)]
        assert {c.label for c in mine} == {f"bf16_{arch}", f"fp8e4nv_{arch}",
                                           f"bf16_contig_{arch}"}
        for c in mine:
            assert (c.constexprs["BLOCK_M"], c.constexprs["BLOCK_N"], c.num_warps,
                    c.num_stages) == (bm, bn, nw, ns)
            assert dict(c.options) == te.CDNA_OPTIONS and c.uses_dot
    # the NVIDIA-tuned 16-bit cases are not built for CDNA any more
    for c in cases:
        if c.uses_dot and not (c.targets or ("",))[0].startswith("gfx"):
            assert c.targets and all(t.startswith("sm_") for t in c.targets), c.name


def test_mla_cdna_configs_per_arch():
    """MLA on CDNA: 4 waves and 32-key tiles on both archs (8 waves spilled), one stage in
    gfx942's 64 KB of LDS, two in gfx950's 160 KB with at most 32 rows (their LDS and scratch:
    test_cdna_records)."""
    from tskernels.ops.mla import triton as mt

    for arch in mt.CDNA_ARCHS:
        for heads in (1, 8, 16, 32, 64, 128):
            br, bn, nw, ns = mt.cdna_config(arch, heads)
            assert (bn, nw) == (32, 4)
            assert ns == (2 if arch == "gfx950" else 1)
            assert 16 <= br <= (32 if arch == "gfx950" else 64) and br & (br - 1) == 0
            assert br >= min(heads, 16) and (br <= max(16, heads))
    assert mt.CDNA_OPTIONS == {"matrix_instr_nonkdim": 16}


def test_mla_compile_cases_split_nvidia_and_cdna():
    from tskernels.ops.mla import triton as mt

    cases = mt._cases()
    for arch in mt.CDNA_ARCHS:
        mine = [c for c in cases if c.targets == (arch,)]
        assert len(mine) == 4 and all(dict(c.options) == mt.CDNA_OPTIONS for c in mine)
        for c in mine:
            heads = 16 if c.constexprs["BLOCK_R"] == 16 else 128
            assert (c.constexprs["BLOCK_R"], c.constexprs["BLOCK_N"], c.num_warps,
                    c.num_stages) == mt.cdna_config(arch, heads)
    # every other dot case is built for NVIDIA targets only
    for c in cases:
        if not (c.targets or ("",))[0].startswith("gfx"):
            assert c.targets and all(t.startswith("sm_") for t in c.targets), c.name


def test_cdna_records():
    """The recorded CDNA builds (tests/compile/resources.json, re-recorded from the compile
    matrix): every gfx942 / gfx950 case fits the arch's LDS and none uses scratch."""
    import json
    from pathlib import Path

    doc = json.loads(Path(__file__).with_name("resources.json").read_text())
    rows = {k: v for k, v in doc.items() if k.split("|")[-1] in ("gfx942", "gfx950")}
    assert rows
    bad = [f"{k}: {v}" for k, v in rows.items() if v["spill_bytes"] or not v["fits"]]
    assert not bad, "\n".join(bad)


def test_gemm_cdna_tables():
    """gemm.mm / fp8_block_mm on CDNA: per-arch tables whose tiles fit the arch (the tuning
    space's prune accepts them), AMD knobs declared per arch in the spaces (kpack on gfx942
    only), one compile case per table row with its knobs, and the NVIDIA tables unchanged."""
    from tskernels.ops.gemm import _tune, triton_mm as mm

    assert mm.tables(False) is mm.MM_CONFIGS and mm.tables(True) is mm.FP8_CONFIGS
    for fp8, ks in ((False, _tune.MM), (True, _tune.FP8_MM)):
        for arch in ("gfx942", "gfx950"):
            target = Target.for_arch(arch)
            table = mm.tables(fp8, arch)
            assert table != mm.tables(fp8)
            space = ks.space_for("amd", arch)
            assert ("kpack" in space.choices) == (arch == "gfx942")
            for max_m, cfg in table:
                p = {"M": max_m or 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
                assert ks.prune(cfg, p, target) is None, (arch, cfg)
                for knob, v in cfg.items():
                    if knob in space.choices:
                        assert v in space.choices[knob], (arch, knob, v)
                assert cfg["matrix_instr_nonkdim"] == 16
                if fp8:
                    assert cfg["BK"] == 128 and 128 % cfg["BN"] == 0
            labels = {c.label: c for c in mm.compile_cases(fp8) if c.targets == (arch,)}
            assert len(labels) == len(table)
            for c in labels.values():
                assert c.uses_dot and dict(c.options)["matrix_instr_nonkdim"] == 16
        # NVIDIA spaces get no AMD knobs
        assert not set(ks.space_for("nvidia", "sm_90").choices) & {"kpack", "waves_per_eu"}


def test_moe_cdna_tables():
    """moe.fused_experts on CDNA: per-arch tables (2 stages; the fp8 prefill gate-up on 4
    waves), the compile cases built from them per arch with the MFMA knob (fp8 on gfx950
    only), the NVIDIA table and its cases untouched by the arch."""
    from tskernels.ops.moe import triton_experts as te

    for fp8 in (False, True):
        for tokens in (1, 64, 1024, 8192):
            nv = te.tiles_for(tokens, fp8)
            assert te.tiles_for(tokens, fp8, None) == nv
            for arch in ("gfx942", "gfx950"):
                t = te.tiles_for(tokens, fp8, arch)
                assert (t.up_stages, t.down_stages) == (2, 2) and t.block_m == nv.block_m
                assert t.up_warps == (4 if fp8 and t.block_m >= 64 else nv.up_warps)
    cases = te._cases()
    for arch in ("gfx942", "gfx950"):
        mine = [c for c in cases if c.targets == (arch,)]
        assert len(mine) == (8 if arch == "gfx950" else 4)
        assert all(dict(c.options) == te.CDNA_OPTIONS and c.uses_dot for c in mine)
    for c in cases:
        if c.uses_dot and c.targets is not None and not c.targets[0].startswith("gfx"):
            assert all(t.startswith("sm_") for t in c.targets), c.name


def test_decode_cdna_launch():
    """attention.decode on CDNA: gfx942 one K/V buffer in LDS (2 stages), gfx950 two (3),
    16x16 MFMA, waves_per_eu 3 only where it compiled without scratch (gfx950); the AMD knobs
    declared in the decode space for AMD only; compile cases per arch with these launches."""
    from tskernels.ops.attention import triton_decode as td

    assert td.cdna_launch("gfx942", False) == (2, {"matrix_instr_nonkdim": 16, "waves_per_eu": 2})
    assert td.cdna_launch("gfx942", True)[1]["waves_per_eu"] == 2
    assert td.cdna_launch("gfx950", True) == (3, {"matrix_instr_nonkdim": 16, "waves_per_eu": 3})
    amd = td.SPACE.space_for("amd", "gfx942").choices
    assert amd["waves_per_eu"] == [2, 3] and amd["matrix_instr_nonkdim"] == [16]
    assert "waves_per_eu" not in td.SPACE.space_for("nvidia", "sm_90").choices
    cases = td._cases()
    for arch in ("gfx942", "gfx950"):
        mine = [c for c in cases if c.targets == (arch,)]
        assert mine and all(c.uses_dot for c in mine)
        for c in mine:
            ns, opts = td.cdna_launch(arch, "fp8" in c.signature["k_ptr"])
            assert c.num_stages == ns and dict(c.options) == opts
    for c in cases:
        if c.uses_dot:
            assert c.targets and (c.targets[0].startswith("gfx") or
                                  all(t.startswith("sm_") for t in c.targets)), c.name


def test_gdn_chunk_cdna_launches():
    """gdn.chunk_prefill on CDNA: the state kernel's 16 value columns and per-arch stages fit
    the arch's LDS (gfx942's 64 KB held 72 KB with the NVIDIA launch), 16 x 16 MFMA for the
    WY / state kernels; compile cases per arch with these launches; the NVIDIA dot cases (the
    run-verified launches: WY 4 warps with the key reload, state 32 columns, output 4 warps x
    128 columns, the split WY pair) are built for NVIDIA only; a CDNA device gets the fused WY
    kernel by default (the only WY launch built for it) and 8-wave output programs."""
    from tskernels.ops.gdn import triton_chunk as tc

    assert tc.CDNA_STATE == {"gfx942": (16, 2), "gfx950": (16, 3)}
    assert tc.CDNA_OPTIONS == {"matrix_instr_nonkdim": 16}
    def state_lds(bv, ns):  # W and K chunk tiles (64 x 128, 16-bit) per prefetched stage
        return (ns - 1) * 2 * 64 * 128 * 2 + 128 * bv * 2  # + the state operand (as compiled)

    assert state_lds(32, 3) == 72 * 1024 > Target.for_arch("gfx942").smem_bytes
    for arch, (bv, ns) in tc.CDNA_STATE.items():
        assert state_lds(bv, ns) <= Target.for_arch(arch).smem_bytes, arch
    assert tc.cdna_arch(torch.device("cpu")) is None
    cases = tc._cases()
    nv = {c.label: c for c in cases if c.targets and c.targets[0].startswith("sm_")}
    assert (nv["wy"].num_warps, nv["wy"].constexprs["RELOAD_K"]) == (4, True)
    assert (nv["state"].constexprs["BV"], nv["state"].num_warps, nv["state"].options) == \
        (32, 4, ())
    assert (nv["output"].num_warps, nv["output"].constexprs["BV"]) == (4, 128)
    assert {"wy_solve", "wy_apply"} <= set(nv)
    for arch in tc.CDNA_ARCHS:
        mine = {c.label: c for c in cases if c.targets == (arch,)}
        assert set(mine) == {f"wy_{arch}", f"state_{arch}", f"output_{arch}"}
        st = mine[f"state_{arch}"]
        assert (st.constexprs["BV"], st.num_stages) == tc.CDNA_STATE[arch]
        assert dict(st.options) == dict(mine[f"wy_{arch}"].options) == tc.CDNA_OPTIONS
        assert mine[f"wy_{arch}"].num_warps == 4 and mine[f"output_{arch}"].num_warps == 8
        assert all(c.uses_dot for c in mine.values())
    for c in cases:
        if c.uses_dot:
            assert c.targets and (c.targets[0].startswith("gfx") or
                                  all(t.startswith("sm_") for t in c.targets)), c.name


def test_gemv_cdna_tables():
    """gemm.gemv on CDNA: per-arch streaming configs whose LDS stages (AMD keeps
    num_stages - 1) let the split's 4 programs share a CU, accepted by the tuning space's prune
    with the AMD knobs declared for AMD only; compile cases per arch; the NVIDIA table and its
    H200-measured shape configs untouched."""
    from tskernels.ops.gemm import _tune, triton_gemv as g

    assert g.STREAM_CONFIGS[("16bit", 16)] == dict(BN=64, BK=128, num_stages=4, num_warps=4)
    for arch, cfg in g.CDNA_STREAM_CONFIGS.items():
        target = Target.for_arch(arch)
        lds = (cfg["num_stages"] - 1) * (cfg["BN"] + 16) * cfg["BK"] * 2
        assert g.TARGET_PROGRAMS_PER_SM * lds <= target.smem_bytes, arch
        assert cfg["matrix_instr_nonkdim"] == 16 and cfg["num_warps"] == 4
        space = _tune.GEMV.space_for("amd", arch)
        assert _tune.GEMV.prune(cfg, {"M": 1, "N": 4096, "K": 4096}, target) is None
        for knob in ("BN", "BK", "num_stages", "num_warps", "matrix_instr_nonkdim"):
            assert cfg[knob] in space.choices[knob], (arch, knob)
        mine = [c for c in g.compile_cases(False) if c.targets == (arch,)]
        assert len(mine) == 2
        for c in mine:
            assert (c.constexprs["BN"], c.constexprs["BK"], c.num_stages, c.num_warps) == \
                (cfg["BN"], cfg["BK"], cfg["num_stages"], cfg["num_warps"])
            assert dict(c.options) == {"matrix_instr_nonkdim": 16} and c.uses_dot
    assert not set(_tune.GEMV.space_for("nvidia", "sm_90").choices) & {"waves_per_eu",
                                                                      "matrix_instr_nonkdim"}
    assert _tune.stream_config(1, 4096, 4096, False, torch.bfloat16, torch.device("cpu")) == \
        g.STREAM_CONFIGS[("16bit", 16)]
    for c in g.compile_cases(False):
        assert c.targets and (c.targets[0].startswith("gfx") or
                              all(t.startswith("sm_") for t in c.targets)), c.name
