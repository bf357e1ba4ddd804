"""tskernels-bench runs on CPU (reference timings) and emits well-formed JSON."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tskernels.bench.cli import main, parse_shapes


def test_parse_shapes():
    assert parse_shapes("B=16,L=4096;B=1,L=2.5,kv=fp8") == [
        {"B": 16, "L": 4096}, {"B": 1, "L": 2.5, "kv": "fp8"}]


@pytest.mark.parametrize("op", ["norm.rmsnorm", "activation.silu_and_mul", "rope.apply_rope",
                                "attention.store_kv"])
def test_bench_json(op, capsys):
    assert main([op, "--json", "-", "--iters", "3"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["op"] == op and res["rows"]
    row = res["rows"][0]
    assert row["ours"]["us"] > 0 and row["bytes"] > 0
    base = [k for k in row if k not in ("ours", "shape", "input_sets", "bytes", "flops")]
    assert base and all(row[b]["us"] > 0 and row[b]["speedup_of_ours"] > 0 for b in base)


def test_console_script_entry():
    out = subprocess.run([sys.executable, "-m", "tskernels.bench.cli", "--list"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "norm.rmsnorm" in out.stdout


def test_bench_several_ops_and_modes_into_a_directory(tmp_path, capsys):
    assert main(["norm.rmsnorm", "activation.silu_and_mul", "--modes", "eager",
                 "--iters", "2", "--json-dir", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["activation_silu_and_mul.json", "norm_rmsnorm.json"]
    res = json.loads((tmp_path / "norm_rmsnorm.json").read_text())
    assert res["op"] == "norm.rmsnorm" and res["rows"][0]["ours"]["us"] > 0
    assert main(["norm.rmsnorm", "--modes", "eager,sideways"]) == 2


@pytest.mark.parametrize("op", ["attention.decode", "attention.extend"])
def test_attention_bench_runs_on_cpu_and_names_the_backend(op, capsys):
    """No --backend on a CPU: ours is the registry's choice there, Triton-only rows are left
    out, and the JSON / table say which backend ran."""
    # (the extend's smallest problem: its CPU default takes ~55 s in the interpreter)
    small = ["--shapes", "N=16,P=16"] if op == "attention.extend" else []
    assert main([op, "--json", "-", "--iters", "1", *small]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["backend"] == "selected: reference"
    row = res["rows"][0]
    assert row["ours_backend"] == "reference" and row["ours"]["us"] > 0
    import tskernels
    # under TRITON_INTERPRET=1 (the test tier) the Triton rows run in the interpreter
    triton_here = tskernels.available("attention", op.split(".")[1], "triton", device="cpu")
    assert ("tskernels_triton" in row) is triton_here and "torch_sdpa_contiguous" in row


def test_attention_bench_without_triton_leaves_its_rows_out():
    out = subprocess.run([sys.executable, "-m", "tskernels.bench.cli", "attention.decode",
                          "--iters", "1"], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "TRITON_INTERPRET": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[selected: reference]" in out.stdout and "[reference]" in out.stdout
    assert "tskernels_triton" not in out.stdout


def test_a_shape_missing_a_key_is_one_line_naming_it(capsys):
    from tskernels.bench.cli import main
    assert main(["attention.extend", "--shapes", "B=1,L=64", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lacks 'N'" in err and "--shapes 'N=" in err


def test_a_baseline_that_fails_is_recorded_not_fatal(monkeypatch):
    """A baseline that cannot run a shape (cuBLAS's block-scaled fp8 at M = 1 on the H200's
    torch) leaves its error in the row; ours and the other baselines are still timed. A failure
    of ours still raises."""
    import torch

    from tskernels.bench.cli import _table
    from tskernels.bench import core
    from tskernels.bench.core import Bench, run_bench

    def register_bench(b):  # for this test only
        monkeypatch.setitem(core._BENCHES, b.name, b)

    def boom(_d):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED\nmore text")

    def make(shape, device, gen):
        return {"x": torch.randn(shape["n"], generator=gen, device=device)}
    register_bench(Bench("test.failing_baseline", [{"n": 64}], make, ours=lambda d: d["x"] * 2,
                         baselines={"broken": boom, "fine": lambda d: d["x"] + 1},
                         bytes=lambda s: 8 * s["n"]))
    res = run_bench("test.failing_baseline", device="cpu", iters=2)
    row = res["rows"][0]
    assert row["ours"]["us"] > 0 and row["fine"]["speedup_of_ours"] > 0
    assert row["broken"] == {"error": "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"}
    assert "broken: failed (RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED)" in _table(res)
    register_bench(Bench("test.failing_ours", [{"n": 64}], make, ours=boom))
    with pytest.raises(RuntimeError, match="CUBLAS"):
        run_bench("test.failing_ours", device="cpu", iters=2)
