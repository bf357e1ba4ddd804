"""The Blackwell CUDA kernels without Blackwell hardware: compile checks and host-side logic.

`mla.decode.cuda_tcgen05` (tskernels/ops/mla/cuda/mla_decode_tcgen05.cu) was never run: these
tests are its whole evidence. For every build (bf16 / fp16 q, 16-bit / fp8 latents) and each
arch-specific Blackwell target this nvcc has (sm_100a, sm_103a), nvcc and NVRTC must build it,
the PTX must hold the tcgen05 forms the design relies on (MMA into tensor memory, alloc /
relinquish / dealloc, ld / st, commit to an mbarrier) and TMA bulk-tensor copies, the SASS the
matching machine instructions (UTCHMMA, UTCBAR, LDTM / STTM, UTMALDG), with no spills and no
more registers than recorded in blackwell_resources.json (a regression check). The launch
arithmetic (shared / tensor memory budgets, the grid and tile schedule, the split policy) is
checked against the architecture's limits. Tools missing: skipped outside CI, failed in CI
(tskernels.testing.toolchain)."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tskernels
from tskernels import registry
from tskernels.ops.mla import cuda_decode_sm100 as bw
from tskernels.platform import Platform, nvidia_features
from tskernels.testing.toolchain import IN_CI, cuda_tool, require_tool

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = Path(__file__).with_name("blackwell_resources.json")
OUT = ROOT / "build" / "blackwell_compile.json"
_GET = "pip install -e '.[test]' brings it (NVIDIA's wheels), or a CUDA toolkit on PATH"
NVCC = require_tool("nvcc", cuda_tool("nvcc"), f"the Blackwell kernels are compile-checked; {_GET}")
CUOBJDUMP = require_tool("cuobjdump", cuda_tool("cuobjdump"), f"reads the SASS; {_GET}")

BUILDS = {"bf16": (False, False), "fp16": (True, False), "fp8": (False, True),
          "fp8_qf16": (True, True)}  # name -> (fp16, fp8)
PTX_FORMS = {  # the tcgen05 / TMA forms the kernel's design needs, as PTX
    "mma": r"tcgen05\.mma\.cta_group::1\.kind::f16 ",
    "alloc": r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32",
    "relinquish": r"tcgen05\.relinquish_alloc_permit\.cta_group::1",
    "dealloc": r"tcgen05\.dealloc\.cta_group::1",
    "ld": r"tcgen05\.ld\.sync\.aligned\.32x32b\.x32\.b32",
    "st": r"tcgen05\.st\.sync\.aligned\.32x32b\.x32\.b32",
    "commit": r"tcgen05\.commit\.cta_group::1\.mbarrier::arrive::one",
    "tma": r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier",
}
# SASS: tcgen05.mma -> UTCHMMA (36 logits k-steps + 2 P V k-steps, unrolled), commit -> UTCBAR,
# tcgen05.ld / st -> LDTM / STTM, TMA -> UTMALDG
SASS_COUNTS = {"UTCHMMA": 38, "UTCBAR": 3}
SASS_PRESENT = ("LDTM", "STTM", "UTMALDG")


def _archs() -> list[str]:
    r = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True)
    have = set(r.stdout.split())
    out = [f"sm_{n}a" for n in (100, 103) if f"compute_{n}" in have]
    assert "sm_100a" in out, r.stdout
    return out


ARCHS = _archs()


def _sass(cubin: Path) -> str:
    r = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _nvcc(build: str, arch: str, tmp: Path) -> dict:
    fp16, fp8 = BUILDS[build]
    opts = bw.nvcc_options(fp16, fp8=fp8)
    sm = arch.removeprefix("sm_")
    ptx = subprocess.run([NVCC, *opts, f"-arch=compute_{sm}", "-ptx", str(bw.SOURCE), "-o",
                          str(tmp / "k.ptx")], capture_output=True, text=True)
    assert ptx.returncode == 0, ptx.stderr[-3000:]
    cub = subprocess.run([NVCC, *opts, f"-gencode=arch=compute_{sm},code={arch}", "-cubin",
                          "-Xptxas", "-v", str(bw.SOURCE), "-o", str(tmp / "k.cubin")],
                         capture_output=True, text=True)
    assert cub.returncode == 0, cub.stderr[-3000:]
    text, sass = (tmp / "k.ptx").read_text(), _sass(tmp / "k.cubin")
    regs = re.search(r"Used (\d+) registers", cub.stderr)
    spill = re.search(r"(\d+) bytes spill stores", cub.stderr)
    return dict(kernel="mla_decode_tcgen05", build=build, target=arch, compiler="nvcc",
                registers=int(regs.group(1)) if regs else None,
                spill_bytes=int(spill.group(1)) if spill else 0,
                smem_bytes=bw.smem_bytes(fp8),
                ptx={k: len(re.findall(p, text)) for k, p in PTX_FORMS.items()},
                sass={k: len(re.findall(rf"\b{k}\b", sass))
                      for k in (*SASS_COUNTS, *SASS_PRESENT)})


def _record(rows: list[dict]) -> None:
    OUT.parent.mkdir(exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else []
    keys = {(r["build"], r["target"], r["compiler"]) for r in rows}
    OUT.write_text(json.dumps([r for r in old if (r["build"], r["target"], r["compiler"])
                               not in keys] + rows, indent=1))


@pytest.mark.parametrize("arch", ARCHS)
def test_mla_decode_tcgen05_nvcc(arch, tmp_path):
    """Every build: the tcgen05 / TMA forms in PTX and SASS, no spills, registers within the
    recorded figure (blackwell_resources.json: raise it deliberately, with the reason)."""
    recorded = json.loads(RESOURCES.read_text())
    rows = [_nvcc(b, arch, tmp_path) for b in BUILDS]
    _record(rows)
    for r in rows:
        assert all(r["ptx"].values()), r
        for k, n in SASS_COUNTS.items():
            assert r["sass"][k] == n, r
        assert all(r["sass"][k] for k in SASS_PRESENT), r
        assert r["spill_bytes"] == 0, r
        # 1 CTA per SM: 65536 registers / threads, and what the recorded build used
        assert r["registers"] <= min(255, 65536 // bw.threads(BUILDS[r["build"]][1])), r
        rec = recorded[f"{r['build']}:{arch}"]
        assert r["spill_bytes"] <= rec["spill_bytes"] and r["registers"] <= rec["registers"], \
            (r, rec, "more registers / spills than recorded")


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        msg = ("cuda.bindings (cuda-python) with NVRTC not installed: the runtime compiles the "
               "kernel with it; pip install -e '.[test]' brings it")
        if IN_CI:
            pytest.fail(msg + "; CI must have it", pytrace=False)
        pytest.skip(msg)
    from tskernels.ops import cuda_driver
    return cuda_driver


@pytest.mark.parametrize("arch", ARCHS)
def test_mla_decode_tcgen05_nvrtc(arch, tmp_path):
    """The runtime's compile path (cuda_driver.nvrtc_cubin with the plan's options, the
    headers passed by name) builds every variant; its SASS carries the same instructions and
    its resource usage no local memory (spills)."""
    cuda_driver = _nvrtc()
    for build, (fp16, fp8) in BUILDS.items():
        cubin = cuda_driver.nvrtc_cubin(bw.SOURCE.read_text(), bw.SOURCE.name,
                                        bw.nvcc_options(fp16, fp8=fp8), arch)
        path = tmp_path / f"{build}.cubin"
        path.write_bytes(cubin)
        sass = _sass(path)
        for k, n in SASS_COUNTS.items():
            assert len(re.findall(rf"\b{k}\b", sass)) == n, (build, arch, k)
        assert all(re.search(rf"\b{k}\b", sass) for k in SASS_PRESENT), (build, arch)
        res = subprocess.run([CUOBJDUMP, "-res-usage", str(path)], capture_output=True,
                             text=True).stdout
        assert re.search(r"\bLOCAL:0\b", res) and re.search(r"\bREG:\d+", res), res


def test_source_constants_match_the_launcher():
    """The .cu's tiling constants are the ones the host arithmetic uses."""
    text = bw.SOURCE.read_text()
    d = {m.group(1): m.group(2) for m in re.finditer(r"^#define (\w+) (\S+)", text, re.M)}
    assert int(d["HM"]) == bw.HEADS_PER_CTA and int(d["BN"]) == bw.BLOCK_N
    assert int(d["DV"]) * bw.COLUMN_HALVES == bw.DC
    assert int(d["TMEM_COLS"]) == bw.tmem_columns()[1]
    assert int(d["S_COL"]) == bw.DC // bw.COLUMN_HALVES
    assert re.search(r"__launch_bounds__\(THREADS, 1\)", text)
    assert re.findall(r"^#define THREADS (\d+)", text, re.M) == [str(bw.threads(True)),
                                                                 str(bw.threads())]


def test_shared_and_tensor_memory_budgets():
    """Against sm_100's limits: 227 KB of dynamic shared memory per CTA (228 KB per SM),
    512 TMEM columns x 128 lanes; one head per lane."""
    for fp8 in (False, True):
        assert bw.smem_bytes(fp8) == 9 * 128 * 128 + 2 * 9 * 32 * 128 + 128 * 32 * 2 + 1152
        assert bw.smem_bytes(fp8) <= bw.SM100_SMEM_PER_BLOCK
        # the fp8 tile (32 rows x 576 bytes) fits the upper half of its stage
        assert 32 * 576 <= 9 * 32 * 128 // 2
    used, alloc = bw.tmem_columns()
    assert used == 256 + 2 * 32 <= alloc <= bw.SM100_TMEM_COLUMNS
    assert alloc & (alloc - 1) == 0 and alloc >= 32
    assert bw.HEADS_PER_CTA == bw.SM100_TMEM_LANES
    # a second CTA could not share the SM anyway (shared memory), so taking all 512 columns
    # blocks nobody
    assert 2 * bw.smem_bytes() > 233472
    assert bw.threads() == 192 and bw.threads(True) == 320


def _kernel_decompose(pid: int, H: int, S: int) -> tuple[int, int, int, int]:
    """The kernel's blockIdx -> (request, head block, column half, split)."""
    hbc = -(-H // bw.HEADS_PER_CTA)
    return pid // (2 * hbc * S), pid % hbc, (pid // hbc) & 1, (pid // (2 * hbc)) % S


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 6), H=st.integers(1, 300), S=st.integers(1, 9))
def test_grid_covers_every_work_item_once(B, H, S):
    items = [_kernel_decompose(p, H, S) for p in range(bw.grid_size(B, H, S))]
    assert len(set(items)) == len(items) == B * bw.head_blocks(H) * 2 * S
    assert {i[0] for i in items} == set(range(B))


@settings(max_examples=200, deadline=None)
@given(L=st.integers(0, 40000), S=st.integers(1, 256))
def test_split_schedule_partitions_the_tiles(L, S):
    tiles = -(-L // bw.BLOCK_N)
    seen = []
    for s in range(S):
        t0, n = bw.split_tiles(L, S, s)
        assert n >= 0
        seen += range(t0, t0 + n)
    assert seen == list(range(tiles))


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 512), H=st.sampled_from([16, 32, 64, 128, 256]),
       L=st.integers(1, 131072), sms=st.sampled_from([148, 160]))
def test_split_policy(B, H, L, sms):
    S = bw.default_splits(B, H, L, sms)
    ctas = B * bw.head_blocks(H) * 2
    assert 1 <= S <= bw.MAX_AUTO_SPLITS
    if S > 1:
        assert ctas * S <= sms                         # one wave
        assert -(-L // bw.BLOCK_N) >= 4 * S            # >= 128 keys per split
    if ctas >= sms:
        assert S == 1


def test_plan_refuses_bad_input_on_cpu():
    """Problems the kernel cannot take are refused by name before anything compiles."""
    pt, sl = torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    kw = dict(num_heads=128, kv_lora_rank=512, rope_dim=64, page_size=64, scale=0.1)
    for change, word in (({"kv_lora_rank": 256}, "kv_lora_rank"), ({"page_size": 16},
                         "page_size"), ({"num_heads": 0}, "num_heads"),
                         ({"kv_dtype": torch.float32}, "fp8"), ({}, "CUDA device")):
        with pytest.raises(ValueError, match=word):
            bw.Sm100MLADecodePlan(pt, sl, **{**kw, **change})


def test_registered_compile_verified_for_sm100_only_and_never_auto_selected():
    spec = next(k for k in tskernels.kernels() if k.name == "mla.decode.cuda_tcgen05")
    assert spec.verification.compiled == frozenset({"sm_100"})
    assert not spec.verification.run                  # never run: no Blackwell hardware
    assert "compiled, not run: no Blackwell hardware" in spec.description
    verified = json.loads((ROOT / "tskernels" / "verified.json").read_text())
    assert "mla.decode.cuda_tcgen05" not in verified.get("kernels", {})
    b200 = Platform("nvidia", 100, "NVIDIA B200", nvidia_features(100), 148)
    prob = ({"q": "bf16", "kv": "bf16"}, {"kv_lora_rank": 512, "rope_dim": 64, "page_size": 64,
                                         "num_heads": 128, "cache_like_q": True})
    old = os.environ.pop("TSKERNELS_ALLOW_UNVERIFIED", None)
    try:
        picks = {}
        for allow in (False, True):
            ov = registry.config.resolve("mla", "decode", None, None, allow)
            chosen, report = registry._decide("mla", "decode", b200, *prob, ov)
            picks[allow] = chosen.backend
            why = next(w for k, w in report if k is not None and k.backend == "cuda_tcgen05")
            assert ("not run-verified" in why) is not allow, why
    finally:
        if old is not None:
            os.environ["TSKERNELS_ALLOW_UNVERIFIED"] = old
    assert picks == {False: "reference", True: "cuda_tcgen05"}


# ---- gemm.mm.cuda_tcgen05 (tskernels/ops/gemm/cuda/gemm_tcgen05.cu) ----
GEMM_BUILDS = {"bf16": (False, False), "fp16": (True, True), "bf16_to_fp16": (False, True)}


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_tcgen05_nvcc_and_nvrtc(arch, tmp_path):
    """nvcc (ptxas -v) and the runtime's NVRTC path build every dtype variant: tcgen05 MMAs
    (m128n256k16 from shared memory), commits, TMEM loads and TMA copies in the SASS, no
    spills, registers within blackwell_resources.json."""
    from tskernels.ops.gemm import cuda_mm_sm100 as g
    recorded = json.loads(RESOURCES.read_text())
    sm = arch.removeprefix("sm_")
    rows = []
    for build, (fp16, out16) in GEMM_BUILDS.items():
        opts = g.nvcc_options(fp16, out16)
        cub = subprocess.run([NVCC, *opts, f"-gencode=arch=compute_{sm},code={arch}",
                              "-cubin", "-Xptxas", "-v", str(g.SOURCE), "-o",
                              str(tmp_path / "g.cubin")], capture_output=True, text=True)
        assert cub.returncode == 0, cub.stderr[-3000:]
        sass = _sass(tmp_path / "g.cubin")
        regs = int(re.search(r"Used (\d+) registers", cub.stderr).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", cub.stderr).group(1))
        r = dict(kernel="gemm_tcgen05", build=f"gemm_{build}", target=arch, compiler="nvcc",
                 registers=regs, spill_bytes=spill, smem_bytes=g.smem_bytes(),
                 sass={k: len(re.findall(rf"\b{k}\b", sass))
                       for k in ("UTCHMMA", "UTCBAR", "LDTM", "UTMALDG")})
        rows.append(r)
        assert all(r["sass"].values()) and spill == 0, r
        rec = recorded[f"gemm_{build}:{arch}"]
        assert regs <= rec["registers"] and spill <= rec["spill_bytes"], (r, rec)
    _record(rows)
    cuda_driver = _nvrtc()
    for fp16, out16 in GEMM_BUILDS.values():
        path = tmp_path / "n.cubin"
        path.write_bytes(cuda_driver.nvrtc_cubin(g.SOURCE.read_text(), g.SOURCE.name,
                                                 g.nvcc_options(fp16, out16), arch))
        sass = _sass(path)
        assert all(re.search(rf"\b{k}\b", sass) for k in ("UTCHMMA", "UTCBAR", "LDTM",
                                                          "UTMALDG")), (fp16, out16, arch)


def test_gemm_tcgen05_host_logic():
    from tskernels.ops.gemm import cuda_mm_sm100 as g
    text = g.SOURCE.read_text()
    d = {m.group(1): m.group(2) for m in re.finditer(r"^#define (\w+) (\S+)", text, re.M)}
    assert (int(d["BM"]), int(d["BN"]), int(d["BK"]), int(d["STAGES"])) == \
        (g.BLOCK_M, g.BLOCK_N, g.BLOCK_K, g.STAGES)
    assert int(d["TMEM_COLS"]) == g.TMEM_COLUMNS <= bw.SM100_TMEM_COLUMNS
    assert g.BLOCK_M == bw.SM100_TMEM_LANES and g.BLOCK_N <= 256  # one m128n256 MMA
    assert g.smem_bytes() == 4 * 48 * 1024 + 1152 <= bw.SM100_SMEM_PER_BLOCK
    assert g.grid(1, 1) == (1, 1) and g.grid(129, 257) == (2, 2) and g.grid(4096, 7168) == \
        (28, 32)
    spec = next(k for k in tskernels.kernels() if k.name == "gemm.mm.cuda_tcgen05")
    assert spec.verification.compiled == frozenset({"sm_100"}) and not spec.verification.run
    assert "compiled, not run: no Blackwell hardware" in spec.description
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    for args, kw, word in (((a, a), {}, "CUDA device"),
                           ((a, a.float()), {}, "must both be bf16"),
                           ((a, a), {"out_dtype": torch.float32}, "out_dtype")):
        with pytest.raises(ValueError, match=word):
            g.mm(*args, **kw)
    b200 = Platform("nvidia", 100, "NVIDIA B200", nvidia_features(100), 148)
    fm = {"a": "bf16", "b": "bf16", "c": "bf16"}
    for allow in (False, True):  # never by itself; first in line once unverified is allowed
        ov = registry.config.resolve("gemm", "mm", None, None, allow)
        chosen, _ = registry._decide("gemm", "mm", b200, fm, {}, ov)
        assert (chosen.backend == "cuda_tcgen05") is allow, (allow, chosen.backend)


# ---- gemm.mm.cuda_tcgen05_2cta (tskernels/ops/gemm/cuda/gemm_tcgen05_2cta.cu): CTA pairs ----
# SASS of the pair forms: m256n256k16 MMAs (UTCHMMA.2CTA), multicast commits (UTCBAR.2CTA),
# TMA copies completing on the even CTA's barrier (UTMALDG.2D.2CTA), the pair's TMEM
# allocation (UTCATOMSWS.2CTA) and cluster barriers (UCGABAR); no one-CTA MMA may remain
PAIR_SASS = {"UTCHMMA.2CTA": 12, "UTCBAR.2CTA.MULTICAST": 4}
PAIR_PRESENT = ("UTMALDG.2D.2CTA", "UTCATOMSWS.2CTA", "UCGABAR_WAIT", "LDTM")


def _pair_sass_ok(sass: str, what) -> dict:
    counts = {k: len(re.findall(rf"\b{re.escape(k)}\b", sass)) for k in (*PAIR_SASS,
                                                                         *PAIR_PRESENT)}
    for k, n in PAIR_SASS.items():
        assert counts[k] == n, (what, counts)
    assert all(counts[k] for k in PAIR_PRESENT), (what, counts)
    assert not re.search(r"\bUTCHMMA(?!\.2CTA)\b", sass), (what, "a one-CTA MMA")
    return counts


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_tcgen05_2cta_nvcc_and_nvrtc(arch, tmp_path):
    """nvcc (ptxas -v) and the runtime's NVRTC path build every dtype variant of the pair
    kernel: the 2-CTA instruction forms in the SASS, no spills / local memory, registers
    within blackwell_resources.json."""
    from tskernels.ops.gemm import cuda_mm_sm100_2cta as g
    recorded = json.loads(RESOURCES.read_text())
    sm = arch.removeprefix("sm_")
    rows = []
    for build, (fp16, out16) in GEMM_BUILDS.items():
        cub = subprocess.run([NVCC, *g.nvcc_options(fp16, out16),
                              f"-gencode=arch=compute_{sm},code={arch}", "-cubin", "-Xptxas",
                              "-v", str(g.SOURCE), "-o", str(tmp_path / "g.cubin")],
                             capture_output=True, text=True)
        assert cub.returncode == 0, cub.stderr[-3000:]
        sass = _sass(tmp_path / "g.cubin")
        regs = int(re.search(r"Used (\d+) registers", cub.stderr).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", cub.stderr).group(1))
        r = dict(kernel="gemm_tcgen05_2cta", build=f"gemm2cta_{build}", target=arch,
                 compiler="nvcc", registers=regs, spill_bytes=spill, smem_bytes=g.smem_bytes(),
                 sass=_pair_sass_ok(sass, (build, arch)))
        rows.append(r)
        assert spill == 0, r
        rec = recorded[f"gemm2cta_{build}:{arch}"]
        assert regs <= rec["registers"] and spill <= rec["spill_bytes"], (r, rec)
    _record(rows)
    cuda_driver = _nvrtc()
    for build, (fp16, out16) in GEMM_BUILDS.items():
        path = tmp_path / "n.cubin"
        path.write_bytes(cuda_driver.nvrtc_cubin(g.SOURCE.read_text(), g.SOURCE.name,
                                                 g.nvcc_options(fp16, out16), arch))
        _pair_sass_ok(_sass(path), (build, arch, "nvrtc"))
        res = subprocess.run([CUOBJDUMP, "-res-usage", str(path)], capture_output=True,
                             text=True).stdout
        assert re.search(r"\bLOCAL:0\b", res), res


def test_gemm_tcgen05_2cta_budgets_and_constants():
    """The .cu's constants are the launcher's; shared memory per CTA and tensor memory per SM
    within sm_100's limits (227 KB, 512 columns x 128 lanes); the pair stages a third less per
    K step than the one-CTA kernel for the same MMA work per CTA."""
    from tskernels.ops.gemm import cuda_mm_sm100 as g1, cuda_mm_sm100_2cta as g
    text = g.SOURCE.read_text()
    d = {m.group(1): m.group(2) for m in re.finditer(r"^#define (\w+) (\S+)", text, re.M)}
    assert (int(d["BM"]), int(d["BN"]), int(d["BN_HALF"]), int(d["BK"]), int(d["STAGES"]),
            int(d["THREADS"]), int(d["TMEM_COLS"])) == \
        (g.BLOCK_M, g.BLOCK_N, g.B_ROWS, g.BLOCK_K, g.STAGES, g.THREADS, g.TMEM_COLUMNS)
    assert re.search(r"__cluster_dims__\(2, 1, 1\)", text) and g.CLUSTER == 2
    assert re.search(r"__launch_bounds__\(THREADS, 1\)", text)
    assert g.stage_bytes() == 32 * 1024 and g.full_barrier_bytes() == 64 * 1024
    assert "2 * STAGE_BYTES" in text  # what the even CTA's full barrier expects
    assert g.smem_bytes() == 7 * 32 * 1024 + 1152 <= g.SM100_SMEM_PER_BLOCK
    assert g.smem_bytes() + g.stage_bytes() > g.SM100_SMEM_PER_BLOCK  # 7 stages is the most
    # m256n256: M = 128 lanes per CTA, N <= 256, 256 fp32 columns per CTA (a power of two
    # >= 32, and room for a second co-resident allocation were the shared memory to allow it)
    assert g.BLOCK_M == bw.SM100_TMEM_LANES and g.CLUSTER * g.BLOCK_M == 256
    assert g.BLOCK_N <= 256 and g.TMEM_COLUMNS == g.BLOCK_N <= g.SM100_TMEM_COLUMNS
    assert g.TMEM_COLUMNS & (g.TMEM_COLUMNS - 1) == 0
    one = (g1.BLOCK_M + g1.BLOCK_N) * g1.BLOCK_K * 2
    assert one == 48 * 1024 and g.stage_bytes() * 3 == one * 2  # per K step, same MMA work
    assert g.BLOCK_M * g.BLOCK_N == g1.BLOCK_M * g1.BLOCK_N


@settings(max_examples=150, deadline=None)
@given(M=st.integers(1, 2000), N=st.integers(1, 2000))
def test_gemm_tcgen05_2cta_tile_schedule(M, N):
    """The grid's CTAs, paired along x, cover every [128 x 256] block of c exactly once, the
    two CTAs of a pair share their columns and take adjacent 128-row halves, and each CTA's b
    rows are its half of the tile's columns."""
    from tskernels.ops.gemm import cuda_mm_sm100_2cta as g
    gx, gy = g.grid(M, N)
    assert gx % g.CLUSTER == 0 and gy >= 1
    seen = set()
    for bx in range(gx):
        for by in range(gy):
            m0, n0, b0 = g.cta_tile(bx, by)
            seen.add((m0, n0))
            assert b0 == n0 + (bx % 2) * g.B_ROWS
            peer = g.cta_tile(bx ^ 1, by)
            assert peer[1] == n0 and abs(peer[0] - m0) == g.BLOCK_M
    want = {(m, n) for m in range(0, -(-M // 256) * 256, 128) for n in range(0, N, 256)}
    assert seen == want and len(seen) == gx * gy
    assert all(m < M or m - 128 < M for m, _ in seen)  # at most the pair's second half idles


def test_gemm_tcgen05_2cta_opt_in_never_auto_selected():
    """Registered compile-verified for sm_100 only, never run, opt-in: no selection picks it
    on a B200 (not even with unverified kernels allowed, where the one-CTA kernel leads);
    named, it is what runs."""
    from tskernels.ops.gemm import cuda_mm_sm100_2cta as g
    spec = next(k for k in tskernels.kernels() if k.name == "gemm.mm.cuda_tcgen05_2cta")
    assert spec.verification.compiled == frozenset({"sm_100"}) and not spec.verification.run
    assert spec.opt_in and "compiled, not run: no Blackwell hardware" in spec.description
    verified = json.loads((ROOT / "tskernels" / "verified.json").read_text())
    assert "gemm.mm.cuda_tcgen05_2cta" not in verified.get("kernels", {})
    b200 = Platform("nvidia", 100, "NVIDIA B200", nvidia_features(100), 148)
    fm = {"a": "bf16", "b": "bf16", "c": "bf16"}
    for allow in (False, True):
        ov = registry.config.resolve("gemm", "mm", None, None, allow)
        chosen, _ = registry._decide("gemm", "mm", b200, fm, {}, ov)
        assert chosen.backend != "cuda_tcgen05_2cta", allow
    ov = registry.config.resolve("gemm", "mm", "cuda_tcgen05_2cta", None, True)
    chosen, _ = registry._decide("gemm", "mm", b200, fm, {}, ov)
    assert chosen.backend == "cuda_tcgen05_2cta"
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    for args, kw, word in (((a, a), {}, "CUDA device"),
                           ((a, a.float()), {}, "must both be bf16"),
                           ((a, a), {"out_dtype": torch.float32}, "out_dtype")):
        with pytest.raises(ValueError, match=word):
            g.mm(*args, **kw)
