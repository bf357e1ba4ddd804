"""Hand-written CUDA sources compile for the targets their registrations claim (nvcc, as the
GPU image's NVRTC would at run time): ptxas accepts them for each target without spilling
much, and the e4m3 warp MMA is in the code. Registers / spills land in
build/cuda_compile.json. CI has no GPU: these builds are the whole evidence for sm_100 and
sm_120 (compile-verified), the GPU tier runs the sm_90 build."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tskernels
from tskernels.ops.attention import cuda_decode

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "cuda_compile.json"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
E4M3_MMA = re.compile(r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32")
CONFIGS = [(4, 2), (2, 3), (4, 3), (2, 4), (8, 2)]  # (warps, stages) plans and tests launch


def _spec():
    return next(k for k in tskernels.kernels() if k.name == "attention.decode.cuda")


def _build(arch: str, warps: int, stages: int, tmp: Path) -> dict:
    sm = arch.removeprefix("sm_")
    base = [NVCC, *cuda_decode.nvcc_options(warps, stages),
            f"-gencode=arch=compute_{sm},code=sm_{sm}", str(cuda_decode.SOURCE)]
    ptx = subprocess.run([*base[:-2], f"-arch=compute_{sm}", "-ptx", str(cuda_decode.SOURCE),
                          "-o", str(tmp / f"k{sm}.ptx")], capture_output=True, text=True)
    assert ptx.returncode == 0, ptx.stderr[-3000:]
    cub = subprocess.run([*base, "-cubin", "-Xptxas", "-v", "-o", str(tmp / f"k{sm}.cubin")],
                         capture_output=True, text=True)
    assert cub.returncode == 0, cub.stderr[-3000:]
    regs = re.search(r"Used (\d+) registers", cub.stderr)
    spill = re.search(r"(\d+) bytes spill stores", cub.stderr)
    return dict(target=arch, warps=warps, stages=stages,
                registers=int(regs.group(1)) if regs else None,
                spill_bytes=int(spill.group(1)) if spill else 0,
                e4m3_mma=bool(E4M3_MMA.search((tmp / f"k{sm}.ptx").read_text())))


def test_nvcc_is_available():
    assert Path(NVCC).exists() or shutil.which("nvcc"), \
        "nvcc not found: the CUDA sources cannot be compile-checked"


@pytest.mark.parametrize("arch", sorted(_spec().verification.compiled))
def test_cuda_decode_compiles(arch, tmp_path):
    rows = [_build(arch, w, s, tmp_path) for w, s in CONFIGS]
    OUT.parent.mkdir(exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps([r for r in old if r["target"] != arch] + rows, indent=1))
    for r in rows:
        assert r["e4m3_mma"], r
        assert r["registers"] and r["registers"] <= 255, r
        assert r["spill_bytes"] < 256, r
