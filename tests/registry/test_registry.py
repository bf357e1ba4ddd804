"""Registry: selection, explain, overrides (call / context / env / TOML), plugins, platforms."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tskernels
from tskernels import registry
from tskernels.platform import Platform, nvidia_features, platform_of
from tskernels.registry import Capability, SelectionError

ROOT = Path(__file__).resolve().parents[2]
H200 = Platform("nvidia", 90, "NVIDIA H200", nvidia_features(90), 132)
B200 = Platform("nvidia", 100, "NVIDIA B200", nvidia_features(100), 148)
MI300 = Platform("amd", "gfx942", "AMD MI300X", frozenset({"mfma", "fp8"}), 304)


@pytest.fixture
def toy(monkeypatch):
    """A private op 'toy.op' with four backends; removed afterwards."""
    def make(name):
        return lambda x: (name, x)
    added = []

    def reg(backend, **kw):
        registry.register("toy", "op", backend=backend, **kw)(make(backend))
        added.append(backend)

    reg("reference", band="reference", run_verified=("cpu",), tags=("deterministic",))
    reg("triton", capability=registry.TRITON_GPU, band="portable", run_verified=("sm_90",),
        compiled=("sm_90", "sm_100", "gfx942"), formats={"x": ("bf16", "fp16")},
        traits={"head_dim": (64, 128)}, tags=("deterministic",))
    reg("cuda_sm90", capability=Capability(frozenset({"nvidia"}), min_sm=90, max_sm=90,
                                           features=frozenset({"wgmma"})),
        band="specialized", run_verified=("sm_90",), tags=("latency",))
    reg("cuda_sm100", capability=Capability(frozenset({"nvidia"}), min_sm=100,
                                            features=frozenset({"tcgen05"})),
        band="specialized", priority=5, compiled=("sm_100",))
    monkeypatch.setattr("tskernels.registry.platform_of", lambda device=None: _PLAT[0])
    yield
    registry._kernels.pop(("toy", "op"), None)
    registry.clear_cache()


_PLAT = [H200]


def _on(p):
    _PLAT[0] = p
    registry.clear_cache()


def test_ranking_filters_and_objectives(toy):
    _on(H200)
    assert tskernels.select("toy", "op", formats={"x": "bf16"}).backend == "cuda_sm90"
    assert tskernels.select("toy", "op", objective="deterministic").backend == "triton"
    assert tskernels.select("toy", "op", objective="portable").backend == "triton"
    # A format or trait the Triton kernel lacks leaves the CUDA kernel or the reference.
    assert tskernels.select("toy", "op", formats={"x": "fp32"},
                            objective="portable").backend == "reference"
    assert tskernels.select("toy", "op", traits={"head_dim": 96},
                            objective="deterministic").backend == "reference"


def test_prefer_limits_auto_selection_not_named_requests(toy):
    """`prefer` predicates gate auto-selection only: outside them the next kernel wins, and a
    named request still runs the kernel (its `traits` accept the problem)."""
    _on(H200)
    registry.register("toy", "op", backend="cuda_big", band="plugin", run_verified=("sm_90",),
                      traits={"batch": lambda b: b >= 1},
                      prefer={"batch": lambda b: b >= 64})(lambda x: ("cuda_big", x))
    assert tskernels.select("toy", "op", traits={"batch": 128}).backend == "cuda_big"
    assert tskernels.select("toy", "op", traits={"batch": 2}).backend == "cuda_sm90"
    assert tskernels.select("toy", "op", traits={"batch": 2}, backend="cuda_big").backend \
        == "cuda_big"
    assert "outside the problems it is preferred for" in tskernels.explain(
        "toy", "op", traits={"batch": 2}, file=False)
    with pytest.raises(SelectionError, match="unsupported"):
        tskernels.select("toy", "op", traits={"batch": 0}, backend="cuda_big")


def test_missing_python_module_makes_a_kernel_unselectable(toy):
    _on(H200)
    registry.register("toy", "op", backend="needs_mod", band="plugin", run_verified=("sm_90",),
                      capability=Capability(frozenset({"nvidia"}),
                                            modules=frozenset({"surely_not_installed_mod"})))(
        lambda x: ("needs_mod", x))
    assert tskernels.select("toy", "op").backend == "cuda_sm90"
    assert "surely_not_installed_mod" in tskernels.explain("toy", "op", file=False)
    with pytest.raises(SelectionError, match="not installed"):
        tskernels.select("toy", "op", backend="needs_mod")


def test_unverified_kernel_never_auto_selected(toy):
    _on(B200)  # cuda_sm100 is compile-verified only; triton is not run-verified on sm_100
    assert tskernels.select("toy", "op").backend == "reference"
    assert tskernels.select("toy", "op", allow_unverified=True).backend == "cuda_sm100"
    text = tskernels.explain("toy", "op", file=False)
    assert "compile-verified on sm_100, not run-verified" in text
    _on(MI300)
    assert tskernels.select("toy", "op").backend == "reference"
    assert tskernels.select("toy", "op", allow_unverified=True).backend == "triton"


def test_cpu_selects_reference_and_explains(toy):
    _on(Platform("cpu"))
    assert tskernels.select("toy", "op").backend == "reference"
    text = tskernels.explain("toy", "op", file=False)
    for b in ("reference", "triton", "cuda_sm90", "cuda_sm100"):
        assert b in text
    assert "vendor 'cpu'" in text and "selected" in text


def test_overrides_precedence(toy, monkeypatch, tmp_path):
    _on(H200)
    cfg = tmp_path / "tsk.toml"
    cfg.write_text('[backend]\n"toy.op" = "reference"\n')
    monkeypatch.setenv("TSKERNELS_CONFIG", str(cfg))
    assert tskernels.select("toy", "op").backend == "reference"          # TOML
    monkeypatch.setenv("TSKERNELS_BACKEND", "toy=triton")
    assert tskernels.select("toy", "op").backend == "triton"             # env beats TOML
    with tskernels.use_backend({"toy.op": "cuda_sm90"}):
        assert tskernels.select("toy", "op").backend == "cuda_sm90"      # context beats env
        with tskernels.use_backend("reference"):
            assert tskernels.select("toy", "op").backend == "reference"  # innermost wins
        assert tskernels.select("toy", "op", backend="triton").backend == "triton"  # call wins
    with pytest.raises(SelectionError, match="cannot run here"):
        tskernels.select("toy", "op", backend="cuda_sm100")
    with pytest.raises(SelectionError, match="no backend 'nope'"):
        tskernels.select("toy", "op", backend="nope")
    cfg.write_text('objective = "fastest"\n')
    with pytest.raises(ValueError, match="objective"):
        tskernels.select("toy", "op")


def test_family_level_override_skips_ops_without_that_backend(toy, monkeypatch):
    _on(H200)
    monkeypatch.setenv("TSKERNELS_BACKEND", "*=cpu_stream")   # registered, not for toy.op
    assert tskernels.select("toy", "op").backend == "cuda_sm90"


def test_decisions_are_cached(toy):
    _on(H200)
    a = tskernels.select("toy", "op", formats={"x": "bf16"})
    assert registry._cache and tskernels.select("toy", "op", formats={"x": "bf16"}) is a


def test_platform_detection_never_raises_without_gpu():
    p = platform_of(None)
    assert p.vendor in ("cpu", "nvidia", "amd")
    assert platform_of("cpu").target == "cpu"
    if not torch.cuda.is_available():
        assert platform_of("cuda").vendor == "cpu"  # no driver: described as CPU, no exception


def test_every_family_is_an_attribute():
    for fam in tskernels.FAMILIES:
        assert getattr(tskernels, fam).__name__.endswith(fam)


def test_triton_kernels_declare_compile_targets_and_interpreter():
    for k in tskernels.kernels():
        if k.backend == "triton":
            assert k.verification.interpreter, k.name
            assert set(registry.ALL_TARGETS) <= k.verification.compiled, k.name
            assert k.compile_cases is not None, k.name


def test_run_verification_claims_have_evidence():
    """Every run-verified target in verified.json points at a GPU results file in the repo that
    records the kernel's tests passing there."""
    data = json.loads((ROOT / "tskernels" / "verified.json").read_text())
    for name, rec in data["kernels"].items():
        for target, evidence in rec["run"].items():
            path = ROOT / evidence.split()[-1]
            assert path.exists(), f"{name}: evidence {path} missing"
            results = json.loads(path.read_text())
            assert results["passed"].get(name) is True, f"{name}: not passing in {path}"
            assert results["target"] == target


def test_plugins_list_cli_and_entry_point(tmp_path):
    # A real installed-looking plugin: a dist-info with an entry point, on sys.path.
    (tmp_path / "toyplug.py").write_text(
        "import tskernels\n"
        "def register():\n"
        "    tskernels.register('toy', 'plug', backend='toyplug', band='plugin',"
        " run_verified=('cpu',))(lambda x: x)\n")
    di = tmp_path / "toyplug-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text("[tskernels.plugins]\ntoy = toyplug:register\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    out = subprocess.run([sys.executable, "-m", "tskernels.plugins", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "toyplug:register" in out.stdout and "toy.plug.toyplug" in out.stdout
    assert "norm.rmsnorm.triton" in out.stdout
