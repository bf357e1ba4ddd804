"""AMD CDNA launch configs (heuristic, per arch; no AMD GPU ran them): the attention extend
kernel's gfx942 / gfx950 tiles differ from the NVIDIA ones where the hardware differs (64 KB vs
160 KB of LDS, wave 64), fit the arch's LDS, and are the ones the compile matrix builds for
those archs (with the AMD launch options), where it must show MFMA and no scratch
(test_compile_matrix.py, test_compile_resources.py)."""
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
