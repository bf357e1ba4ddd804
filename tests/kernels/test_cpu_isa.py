"""CPU feature detection, the TSKERNELS_CPU_ISA cap, selection by CPU capability, every SIMD path
of the C++ small-M GEMM (fp32 / bf16 / int8 weights) against float64 truth, gemm.int8w_mm, and
the aarch64 (NEON) compile of the C++ kernels with a cross compiler."""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
from tskernels import platform as plat
from tskernels.numerics import assert_close
from tskernels.ops.gemm import cpu_stream

from ._cpu_paths import each_path, simd_paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_ext = pytest.mark.skipif(not cpu_stream.available(), reason="tskernels._cpu not built")
FP32 = dict(device="cpu", formats={"a": "fp32", "b": "fp32", "c": "fp32"})


@pytest.fixture
def isa_env(monkeypatch):
    """Set TSKERNELS_CPU_ISA for one test (None: unset); the registry's cache keys on the
    platform, which names the cap, so no cache needs clearing."""
    def set_cap(value):
        if value is None:
            monkeypatch.delenv(plat.ISA_ENV, raising=False)
        else:
            monkeypatch.setenv(plat.ISA_ENV, value)
    set_cap(None)
    return set_cap




def test_features_detected_and_capped(isa_env):
    feats = plat.detected_cpu_features()
    assert feats <= set(plat.CPU_FEATURES)
    assert plat.platform_of("cpu").features == feats
    if os.path.exists("/proc/cpuinfo") and plat.platform_machine() in ("x86_64", "amd64"):
        flags = open("/proc/cpuinfo").read()
        assert ("avx2" in feats) == (" avx2" in flags)
    isa_env("avx2")
    p = plat.platform_of("cpu")
    assert not p.features & {"avx512f", "avx512_bf16", "amx_tile"} and "avx2" in p.name
    assert p.features == feats - {"avx512f", "avx512bw", "avx512_bf16", "avx512_vnni",
                                  "amx_tile", "amx_bf16", "amx_int8"}
    isa_env("scalar")
    assert plat.platform_of("cpu").features == frozenset()
    isa_env("bogus")  # describing the platform never raises: an unknown cap is ignored
    assert plat.platform_of("cpu").features == feats


@needs_ext
def test_cpp_dispatch_follows_the_cap(isa_env):
    best = cpu_stream._cpu.detected_isa()
    assert cpu_stream._cpu.isa() == best
    isa_env("scalar")
    assert cpu_stream._cpu.isa() == "scalar"
    isa_env("avx2")
    assert cpu_stream._cpu.isa() == ("avx2" if best in ("avx512", "avx2") else best)


@needs_ext
def test_selection_by_cpu_capability(isa_env):
    fast = bool(set(simd_paths()) - {"scalar"})
    with tskernels.use_backend(tskernels.KernelPolicy({"gemm.mm": ("cpu_stream",
                                                                   "torch_native")})):
        want = "cpu_stream" if fast else "torch_native"
        assert tskernels.select("gemm", "mm", **FP32).backend == want
        isa_env("scalar")  # no SIMD path: the slow portable loop is never chosen
        assert tskernels.select("gemm", "mm", **FP32).backend == "torch_native"
        text = tskernels.explain("gemm", "mm", **FP32, file=False)
    assert "cpu features: none detected" in text
    assert "needs avx512f+fma or avx2+fma or neon" in text
    with pytest.raises(tskernels.SelectionError, match="needs avx512f"):
        tskernels.select("gemm", "mm", backend="cpu_stream", **FP32)


@needs_ext
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 16), n=st.integers(1, 200),
       k=st.integers(1, 200), wt=st.sampled_from(["fp32", "bf16", "int8"]),
       threads=st.sampled_from([1, 2]))
def test_every_simd_path_matches_float64(seed, m, n, k, wt, threads):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    if wt == "int8":
        q, s = tskernels.gemm.quantize_int8_per_channel(w)
        truth = a.double() @ (q.double() * s.double()[:, None]).t()
    else:
        q = w.to(torch.bfloat16) if wt == "bf16" else w
        truth = a.double() @ q.double().t()

    def check(path):
        c = torch.full((m, n), float("nan"))
        if wt == "int8":
            cpu_stream._cpu.gemm_i8w(a.data_ptr(), q.data_ptr(), s.data_ptr(), c.data_ptr(),
                                     m, n, k, k, k, n)
        else:
            fn = cpu_stream._cpu.gemm_f32 if wt == "fp32" else cpu_stream._cpu.gemm_bf16w
            fn(a.data_ptr(), q.data_ptr(), c.data_ptr(), m, n, k, k, k, n)
        assert_close(c, truth, dtype=torch.float32, name=f"{wt} weights, {path} path")
    each_path(check, threads)


@pytest.mark.parametrize("backend", ["reference"] + (["cpu_stream"] if cpu_stream.available()
                                                     else []))
@pytest.mark.parametrize("m,n,k", [(1, 49152, 576), (8, 3072, 576), (5, 576, 1536),
                                   (40, 130, 70)])
def test_int8w_mm_matches_dequantized_float64(backend, m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    q, s = tskernels.gemm.quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and s.shape == (n,) and int(q.abs().max()) <= 127
    # round to nearest: at most half a step per element
    assert float((q.float() * s[:, None] - w).abs().max() / (s.max() / 2)) <= 1 + 1e-5
    a = torch.randn(m, k, generator=g)
    got = tskernels.gemm.int8w_mm(a, q, s, backend=backend)
    truth = a.double() @ (q.double() * s.double()[:, None]).t()
    assert_close(got, truth, dtype=torch.float32)
    got16 = tskernels.gemm.int8w_mm(a.bfloat16(), q, s, backend=backend)
    assert got16.dtype == torch.bfloat16
    assert_close(got16, a.bfloat16().double() @ (q.double() * s.double()[:, None]).t(),
                 dtype=torch.bfloat16)


def _i8a8_truth(a, q, s):
    """float64 of int8w_mm's act_int8 formula on the reference's activation quantization."""
    from tskernels_ref.gemm import quantize_act_int8_groups

    xq, sx, _ = quantize_act_int8_groups(a)
    m, k = a.shape
    dots = torch.einsum("mgk,ngk->mng", xq.double().view(m, -1, 32),
                        q.double().view(q.shape[0], -1, 32))
    return (dots * sx.double()[:, None, :]).sum(-1) * s.double()


@needs_ext
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 16), n=st.integers(1, 150),
       groups=st.integers(1, 7), threads=st.sampled_from([1, 2]))
def test_int8w_act_int8_every_path_matches_float64(seed, m, n, groups, threads):
    """int8 weights x int8 activation groups: AVX-512 VNNI (64 weights a step; odd group
    counts leave a masked half step), AVX2 (maddubs with the sign trick) and portable."""
    g = torch.Generator().manual_seed(seed)
    k = 32 * groups
    a = torch.randn(m, k, generator=g) * 3
    a[0, :32] = 0  # an all-zero activation group
    q, s = tskernels.gemm.quantize_int8_per_channel(torch.randn(n, k, generator=g))
    truth = _i8a8_truth(a, q, s)
    def check(path):
        c = torch.full((m, n), float("nan"))
        cpu_stream._cpu.gemm_i8w(a.data_ptr(), q.data_ptr(), s.data_ptr(), c.data_ptr(),
                                 m, n, k, k, k, n, act_int8=True)
        assert_close(c, truth, dtype=torch.float32, name=f"int8 x int8, {path} path")
    each_path(check, threads)


@pytest.mark.parametrize("backend", ["reference"] + (["cpu_stream"] if cpu_stream.available()
                                                     else []))
@pytest.mark.parametrize("m", [1, 8, 40])
def test_int8w_mm_act_int8_op_and_its_error(backend, m):
    g = torch.Generator().manual_seed(m)
    a = torch.randn(m, 576, generator=g)
    q, s = tskernels.gemm.quantize_int8_per_channel(torch.randn(4096, 576, generator=g) * .02)
    c = tskernels.gemm.int8w_mm(a, q, s, act_int8=True, backend=backend)
    assert_close(c, _i8a8_truth(a, q, s), dtype=torch.float32, name=backend)
    # 8-bit activation groups of Gaussian rows: ~1 % relative error against float activations
    exact = a.double() @ (q.double() * s.double()[:, None]).t()
    assert float((c.double() - exact).norm() / exact.norm()) < 0.02
    with pytest.raises(ValueError, match="multiple of 32"):
        tskernels.gemm.int8w_mm(a[:, :40], q[:, :40], s, act_int8=True, backend=backend)


def test_int8w_mm_rejects_bad_input():
    a = torch.randn(2, 8)
    q, s = tskernels.gemm.quantize_int8_per_channel(torch.randn(4, 8))
    with pytest.raises((TypeError, ValueError), match="q"):
        tskernels.gemm.int8w_mm(a, q.float(), s)
    with pytest.raises((TypeError, ValueError), match="q"):
        tskernels.gemm.int8w_mm(a, q[:, :4], s)
    with pytest.raises((TypeError, ValueError), match="scale"):
        tskernels.gemm.int8w_mm(a, q, s[:3])
    assert tskernels.select("gemm", "int8w_mm", device="cpu",
                            formats={"a": "fp32", "b": "int8", "c": "fp32"}).backend == "reference"


CROSS = "aarch64-linux-gnu-g++"


def test_cpu_kernels_compile_for_aarch64(tmp_path):
    """Compile-only: every C++ CPU kernel source for aarch64 (the NEON GEMM path, the portable
    paths of the others). .ci/run installs the cross compiler; elsewhere the test skips."""
    cxx = shutil.which(CROSS)
    if cxx is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CROSS} not found: .ci/run installs g++-aarch64-linux-gnu")
        pytest.skip(f"{CROSS} not installed (apt-get install g++-aarch64-linux-gnu)")
    import nanobind

    csrc = os.path.join(ROOT, "tskernels", "csrc")
    srcs = sorted(f for f in os.listdir(csrc) if f.endswith(".cpp"))
    assert "cpu_gemm.cpp" in srcs
    for f in srcs:
        out = tmp_path / (f + ".o")
        r = subprocess.run([cxx, "-std=c++17", "-O2", "-fopenmp", "-Werror=return-type", "-c",
                            "-I", sysconfig.get_paths()["include"], "-I",
                            nanobind.include_dir(), os.path.join(csrc, f), "-o", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{f}: aarch64 compile failed\n{r.stderr[-3000:]}"
    dis = subprocess.run([CROSS.replace("g++", "objdump"), "-d", str(tmp_path /
                                                                    "cpu_gemm.cpp.o")],
                         capture_output=True, text=True, timeout=120).stdout
    assert "fmla" in dis, "the NEON GEMM path emitted no fused multiply-add"


QEMU = "qemu-aarch64-static"
HARNESS = os.path.join(ROOT, "tests", "kernels", "cpu_kernels_harness.cpp")


def _build_harness(cxx: str, out, *extra: str) -> None:
    r = subprocess.run([cxx, "-std=c++17", "-O2", "-fopenmp", *extra, HARNESS, "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{cxx}: harness build failed\n{r.stderr[-3000:]}"


def _run_harness(cmd: list[str], isa: str, env: dict | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})})
    assert r.returncode == 0 and "cpu_kernels_harness: isa=" + isa in r.stdout \
        and r.stdout.rstrip().endswith("OK"), r.stdout[-3000:] + r.stderr[-2000:]
    return r.stdout


def test_gemm_paths_agree_natively(tmp_path):
    """The stand-alone harness on this CPU: its best SIMD path (and AVX2 under the cap) against
    the portable loops: the GEMM (every weight kind, float and int8 activations), SiLU-and-mul,
    paged decode attention."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no native C++ compiler")
    exe = tmp_path / "harness"
    _build_harness(cxx, exe)
    paths = [p for p in simd_paths() if p != "scalar"] or ["scalar"]
    for path in paths:
        _run_harness([str(exe)], path, {plat.ISA_ENV: path})


def test_neon_gemm_paths_run_under_qemu(tmp_path):
    """The aarch64 build of the harness, run under qemu user-mode emulation: the NEON paths
    (GEMM: fp32 / bf16 / int8 / 4-bit weights, float and int8 activations; SiLU-and-mul; the
    decode attention's softmax) agree with the portable loops. Correctness only; no ARM machine
    has timed them. .ci/run installs the emulator."""
    cxx, qemu = shutil.which(CROSS), shutil.which(QEMU)
    if cxx is None or qemu is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CROSS} / {QEMU} not found: .ci/run installs g++-aarch64-linux-gnu "
                        f"and qemu-user-static")
        pytest.skip(f"{CROSS} or {QEMU} not installed")
    exe = tmp_path / "harness_aarch64"
    _build_harness(cxx, exe, "-static")
    out = _run_harness([qemu, str(exe)], "neon")
    assert "cases=" in out
