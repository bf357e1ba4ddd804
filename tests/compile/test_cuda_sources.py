"""Hand-written CUDA sources compile for the targets their registrations claim (nvcc, as the
GPU image's NVRTC would at run time): ptxas accepts them for each target without spilling
much, and the e4m3 warp MMA is in the code. Registers / spills land in
build/cuda_compile.json. CI has no GPU: these builds are the whole evidence for sm_100 and
sm_120 (compile-verified), the GPU tier runs the sm_90 build."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

import tskernels
from tskernels.ops.attention import cuda_decode, cuda_extend
from tskernels.testing.toolchain import cuda_tool, require_tool

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "cuda_compile.json"
_GET = "pip install -e '.[test]' brings it (nvidia-cuda-nvcc wheel), or a CUDA toolkit on PATH"
NVCC = require_tool("nvcc", cuda_tool("nvcc"), f"the CUDA sources are compile-checked with it; {_GET}")
CUOBJDUMP = require_tool("cuobjdump", cuda_tool("cuobjdump"), f"reads the SASS; {_GET}")
NVDISASM = require_tool("nvdisasm", cuda_tool("nvdisasm"), f"reads the SASS; {_GET}")
SASS_MMA = re.compile(r"\b[HQO]MMA\.")          # a tensor-core MMA in the machine code
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
                e4m3_mma=bool(E4M3_MMA.search((tmp / f"k{sm}.ptx").read_text())),
                sass_mma=bool(SASS_MMA.search(_sass(CUOBJDUMP, tmp / f"k{sm}.cubin"))))


def _sass(tool: str, cubin: Path) -> str:
    """The cubin's machine code as text (`cuobjdump -sass` or `nvdisasm`)."""
    cmd = [tool, "-sass", str(cubin)] if tool == CUOBJDUMP else [tool, str(cubin)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_cuda_tools_are_available():
    for tool in (NVCC, CUOBJDUMP, NVDISASM):
        r = subprocess.run([tool, "--version"], capture_output=True, text=True)
        assert r.returncode == 0 and "NVIDIA" in r.stdout, (tool, r.stdout, r.stderr)


@pytest.mark.parametrize("arch", sorted(_spec().verification.compiled))
def test_cuda_decode_compiles(arch, tmp_path):
    rows = [_build(arch, w, s, tmp_path) for w, s in CONFIGS]
    OUT.parent.mkdir(exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps([r for r in old if r["target"] != arch] + rows, indent=1))
    for r in rows:
        assert r["e4m3_mma"] and r["sass_mma"], r
        assert r["registers"] and r["registers"] <= 255, r
        assert r["spill_bytes"] < 256, r


def test_cuda_decode_timing_build(tmp_path):
    """The diagnostics build (-DTIMING, benchmarks/cta_timeline.py) compiles for sm_90 and
    carries its timer reads; the shipped build has none (same source, macro off)."""
    for extra, want in ((["-DTIMING=64"], True), ([], False)):
        ptx = tmp_path / "t.ptx"
        r = subprocess.run([NVCC, *cuda_decode.nvcc_options(2, 3), *extra, "-arch=compute_90",
                            "-ptx", str(cuda_decode.SOURCE), "-o", str(ptx)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ("%globaltimer" in ptx.read_text()) is want, extra


WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(bf16|f16)")
TMA = re.compile(r"cp\.async\.bulk\.tensor\.2d")
# (keys per tile, stages, fp16, paged): the shipped configs and the ones the GPU tier launches
PREFILL_CONFIGS = [(128, 3, False, False), (128, 3, True, False), (128, 2, False, False),
                   (64, 4, False, False), (128, 3, False, True), (128, 3, True, True),
                   (64, 4, False, True), (128, 2, False, True)]
# paged builds with split-KV (-DSPLIT: partial O / LSE into the workspace) and / or GQA
# packing (-DPACK: rows = (token, head-in-group) pairs): (block_n, stages, fp16, options)
PREFILL_PAGED_VARIANTS = [(128, 3, False, ("-DSPLIT",)), (128, 3, True, ("-DSPLIT",)),
                          (64, 4, False, ("-DSPLIT",)), (128, 3, False, ("-DPACK",)),
                          (128, 3, False, ("-DPACK", "-DSPLIT")),
                          (64, 4, True, ("-DPACK", "-DSPLIT"))]


def _build_sm90a(src, opts, tmp: Path) -> tuple[str, dict]:
    """nvcc PTX and cubin (ptxas -v) of one config: the PTX text and what ptxas reported."""
    ptx = subprocess.run([NVCC, *opts, "-arch=compute_90a", "-ptx", str(src), "-o",
                          str(tmp / "k.ptx")], capture_output=True, text=True)
    assert ptx.returncode == 0, ptx.stderr[-3000:]
    cub = subprocess.run([NVCC, *opts, "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                          "-Xptxas", "-v", str(src), "-o", str(tmp / "k.cubin")],
                         capture_output=True, text=True)
    assert cub.returncode == 0, cub.stderr[-3000:]
    regs = re.search(r"Used (\d+) registers", cub.stderr)
    spill = re.search(r"(\d+) bytes spill stores", cub.stderr)
    sass = _sass(NVDISASM, tmp / "k.cubin")
    # ptxas reports serialised warpgroup MMAs as "Potential Performance Loss"
    return (tmp / "k.ptx").read_text(), dict(
        target="sm_90a", registers=int(regs.group(1)) if regs else None,
        spill_bytes=int(spill.group(1)) if spill else 0,
        serialized="Potential Performance Loss" in cub.stderr, log=cub.stderr[-2000:],
        sass_wgmma=bool(re.search(r"\bHGMMA\.64x\d+x16", sass)),
        sass_qgmma=len(re.findall(r"\bQGMMA\.64x128x32\.F32\.E4M3\.E4M3", sass)),
        sass_tma=bool(re.search(r"\bUTMALDG\b", sass)))


def _record(kernel: str, rows: list[dict]) -> None:
    OUT.parent.mkdir(exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps([r for r in old if r.get("kernel") != kernel] +
                              [{k: v for k, v in r.items() if k != "log"} for r in rows],
                              indent=1))


def test_cuda_prefill_compiles(tmp_path):
    """The wgmma prefill builds for sm_90a (its only target: wgmma and setmaxnreg need the
    arch-specific feature set) with the warpgroup MMAs and TMA copies in its PTX, no spills
    and no serialised MMAs."""
    for name in ("attention.extend.cuda", "attention.extend.cuda_paged"):
        spec = next(k for k in tskernels.kernels() if k.name == name)
        assert spec.verification.compiled == frozenset({"sm_90"})
    rows = []
    configs = [(*c, ()) for c in PREFILL_CONFIGS] + \
        [(bn, st, fp16, True, extra) for bn, st, fp16, extra in PREFILL_PAGED_VARIANTS]
    for bn, stages, fp16, paged, extra in configs:
        opts = cuda_extend.nvcc_options(fp16, stages, bn, extra, paged)
        text, r = _build_sm90a(cuda_extend.SOURCE, opts, tmp_path)
        r.update(kernel="prefill_wgmma", block_n=bn, stages=stages, fp16=fp16, paged=paged,
                 wgmma=bool(WGMMA.search(text)), tma=bool(TMA.search(text)),
                 **({"options": " ".join(extra)} if extra else {}))
        rows.append(r)
        assert r["wgmma"] and r["tma"] and r["sass_wgmma"] and r["sass_tma"], r
        assert r["registers"] and r["registers"] <= 168 and r["spill_bytes"] == 0, r
        assert not r["serialized"], r["log"]
        assert cuda_extend.smem_bytes(stages, bn) <= 232448, r
    _record("prefill_wgmma", rows)


def test_cuda_mla_decode_compiles(tmp_path):
    """The wgmma MLA decode builds for sm_90a (bf16 / fp16 q, 16-bit / fp8 latents) with its
    warpgroup MMAs (the 64-key logits and the 256-column P V, from registers and from shared
    memory) and TMA copies in the PTX, no spills and no ptxas-serialised MMAs, within the
    shared-memory limit."""
    from tskernels.ops.mla import cuda_decode
    spec = next(k for k in tskernels.kernels() if k.name == "mla.decode.cuda")
    assert spec.verification.compiled == frozenset({"sm_90"})
    assert cuda_decode.smem_bytes() <= 232448 and cuda_decode.smem_bytes(fp8=True) <= 232448
    rows = []
    for fp16, fp8 in ((False, False), (True, False), (False, True), (True, True)):
        text, r = _build_sm90a(cuda_decode.SOURCE, cuda_decode.nvcc_options(fp16, fp8=fp8),
                               tmp_path)
        shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", text)
        r.update(kernel="mla_decode_wgmma", fp16=fp16, fp8=fp8, shapes=sorted(set(shapes)),
                 tma=bool(TMA.search(text)))
        rows.append(r)
        assert r["shapes"] == ["m64n256k16", "m64n64k16"] and r["tma"], r
        assert r["sass_wgmma"] and r["sass_tma"], r
        assert r["registers"] and r["registers"] <= 168 and r["spill_bytes"] == 0, r
        assert not r["serialized"], r["log"]
    _record("mla_decode_wgmma", rows)


QGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3")
# (block_n, stages, pipe, cluster, cbuf, out dtype): the shipped config first, then what the
# GPU tier and the lab script launch
FP8_CONFIGS = [(256, 3, False, 1, 2, torch.bfloat16), (128, 6, True, 1, 0, torch.float16),
               (256, 4, False, 1, 1, torch.bfloat16), (128, 5, False, 1, 2, torch.bfloat16),
               (256, 4, False, 2, 1, torch.bfloat16), (128, 6, False, 2, 0, torch.float32),
               (176, 4, False, 1, 2, torch.bfloat16), (192, 4, False, 1, 1, torch.bfloat16),
               (144, 4, False, 1, 0, torch.float32), (160, 5, False, 1, 2, torch.float16)]
ONE_PASS_QGMMA = r"\bQGMMA\.64x{}x32\.F32\.E4M3\.E4M3"


def test_cuda_fp8_block_mm_compiles(tmp_path):
    """The block-fp8 GEMM builds for sm_90a with its e4m3 warpgroup MMAs (QGMMA 64x128x32 in
    the SASS) and TMA copies, no spills, no ptxas-serialised MMAs, within the shared-memory
    limit, for every config it launches."""
    from tskernels.ops.gemm import cuda_fp8_sm90 as fp8
    spec = next(k for k in tskernels.kernels() if k.name == "gemm.fp8_block_mm.cuda_sm90")
    assert spec.verification.compiled == frozenset({"sm_90"})
    cfg = fp8.CONFIG
    assert (cfg["block_n"], cfg["stages"], cfg["pipe"], cfg["cluster"], cfg["cbuf"]) == \
        FP8_CONFIGS[0][:5]
    rows = []
    for bn, stages, pipe, cl, cbuf, out in FP8_CONFIGS:
        fp8.check_config({"block_n": bn, "stages": stages, "pipe": pipe, "cluster": cl,
                          "cbuf": cbuf})
        text, r = _build_sm90a(fp8.SOURCE, fp8.nvcc_options(bn, stages, pipe, out, cl, cbuf),
                               tmp_path)
        r.update(kernel="fp8_block_wgmma", block_n=bn, stages=stages, pipe=pipe, cluster=cl,
                 cbuf=cbuf, out=str(out), multicast=".multicast::cluster" in text,
                 tma_store="cp.async.bulk.tensor.2d.global.shared::cta" in text,
                 wgmma=bool(QGMMA.search(text)), tma=bool(TMA.search(text)),
                 smem=fp8.smem_bytes(bn, stages, cbuf))
        rows.append(r)
        # 4 MMAs per 128-deep K block, per 128-column half (x2 for the pair of temporaries);
        # a one-pass width: 4 MMAs of m64n{bn}k32 and no 128-wide ones
        one_pass = bn in fp8.ONE_PASS
        r["sass_qgmma_wide"] = len(re.findall(ONE_PASS_QGMMA.format(bn), _sass(
            NVDISASM, tmp_path / "k.cubin"))) if one_pass else 0
        assert (r["wgmma"] or one_pass) and r["tma"] and r["sass_tma"], r
        assert r["multicast"] == (cl == 2), r
        assert r["sass_qgmma"] == (0 if one_pass else 8 if pipe or bn == 256 else 4), r
        assert r["sass_qgmma_wide"] == (4 if one_pass else 0), r
        if one_pass:
            assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k32\.f32\.e4m3"
                             r"\.e4m3", text), r
        assert r["spill_bytes"] == 0 and not r["serialized"], r["log"]
        assert r["smem"] <= fp8.SMEM_LIMIT and r["tma_store"] == (out != torch.float32), r
    _record("fp8_block_wgmma", rows)


# (hidden, inter, top_k, parts, fp16, int64 ids): the Qwen3-30B-A3B shape on 132 SMs in both
# 16-bit types and id widths, and a narrower top-4 shape whose last CTAs have no output rows
MOE_DECODE_SHAPES = [(2048, 768, 8, 16, False, False, ()), (2048, 768, 8, 16, True, True, ()),
                     (1024, 512, 4, 33, False, False, ()),
                     (2048, 768, 8, 16, False, False, ("-DPDL",)),
                     (2048, 768, 8, 16, False, False, ("-DLATE_COPY",))]


def test_cuda_moe_decode_compiles(tmp_path):
    """The one-token MoE kernel builds for sm_90a with its bulk copies (UBLKCP, completing on
    an mbarrier) and streaming 128-bit weight loads in the SASS, no spills, its shared memory
    within the limit, for the shapes `fits` takes."""
    from tskernels.ops.moe import cuda_decode_sm90 as md
    spec = next(k for k in tskernels.kernels() if k.name == "moe.fused_experts.cuda_sm90")
    assert spec.verification.compiled == frozenset({"sm_90"})
    rows = []
    for h, i, k, parts, fp16, ids64, extra in MOE_DECODE_SHAPES:
        assert md.fits(h, i, k, k * parts), (h, i, k, parts)
        text, r = _build_sm90a(md.SOURCE, md.nvcc_options(h, i, k, parts, fp16, ids64) + extra,
                               tmp_path)
        sass = _sass(NVDISASM, tmp_path / "k.cubin")
        r.update(kernel="moe_decode_sm90", hidden=h, inter=i, top_k=k, parts=parts, fp16=fp16,
                 ids64=ids64, options=" ".join(extra), smem=md.smem_bytes(h, i, k, parts),
                 griddepcontrol="griddepcontrol.wait" in text,
                 bulk_copy="cp.async.bulk.shared::cluster.global.mbarrier" in text,
                 sass_bulk=len(re.findall(r"\bUBLKCP\b", sass)),
                 sass_stream_loads=len(re.findall(r"\bLDG\.E\.NA\.128\b", sass)))
        rows.append(r)
        assert r["bulk_copy"] and r["sass_bulk"] >= 1 and r["sass_stream_loads"] >= 4 * h // 256, r
        assert r["registers"] and r["registers"] <= 255 and r["spill_bytes"] == 0, r["log"]
        assert r["smem"] <= md.SMEM_LIMIT and r["griddepcontrol"] == ("-DPDL" in extra), r
    _record("moe_decode_sm90", rows)
