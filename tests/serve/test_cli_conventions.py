"""`python -m serve` behaves like the serving CLIs users know: --model as well as the
positional, validated dtypes with defaults in --help, --threads, --version, and bad input
rejected in one line before the engine process is spawned."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from serve import cli
from tests.serve.fake_engine import REPO


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_help_shows_choices_and_defaults():
    out = _run("--help").stdout
    for text in ("--model MODEL", "--version", "--threads", "{auto,half,float16,bfloat16,float,float32}",
                 "{auto,fp8,fp8_e4m3}", "(default: auto)"):
        assert text in out, text
    assert f"at least 1: {cli.default_threads()} here" in " ".join(out.split())


def test_version():
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.startswith("tskernels 0.1.0 (torch ")


def _args(*argv):
    args = cli.build_parser().parse_args(list(argv))
    return args, cli.check_args(args)


def test_model_flag_and_positional():
    assert _args("--model", "dummy:tiny-llama")[0].model == "dummy:tiny-llama"
    assert _args("dummy:tiny-llama")[0].model == "dummy:tiny-llama"
    assert _args()[0].model == "default"
    assert "model given twice" in _args("dummy:tiny-llama", "--model", "default")[1]


def test_dtype_aliases_reach_the_engine_as_its_names():
    args, problem = _args("--dtype", "half", "--kv-cache-dtype", "fp8", "--threads", "3")
    assert problem is None
    kw = cli.engine_kwargs(args)
    assert kw["dtype"] == "float16" and kw["kv_cache_dtype"] == "fp8_e4m3" and kw["threads"] == 3
    assert cli.engine_kwargs(_args("--dtype", "float")[0])["dtype"] == "float32"


def test_overlap_lookahead_flag_reaches_the_engine():
    assert cli.engine_kwargs(_args("--overlap-lookahead")[0])["overlap_lookahead"] is True
    assert cli.engine_kwargs(_args("--no-overlap-lookahead")[0])["overlap_lookahead"] is False
    assert "overlap_lookahead" not in cli.engine_kwargs(_args()[0])   # the engine's default


def test_default_threads_is_half_the_cpus():
    import os
    assert cli.default_threads() == max(1, len(os.sched_getaffinity(0)) // 2)


@pytest.mark.parametrize("argv, message", [
    (["/no/such/model"], "model: '/no/such/model' is not a directory"),
    (["dummy:nope"], "model: unknown dummy config 'nope'"),
    (["--threads", "0"], "--threads: expected a positive int, got 0"),
    (["--device", "tpu"], "--device: expected auto, cpu, cuda or cuda:N"),
    (["--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16'"),
])
def test_bad_input_is_one_line_before_any_engine(argv, message):
    t0 = time.monotonic()
    out = _run(*argv)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "engine" not in out.stderr.lower().replace(
        "engine's", "")
    assert time.monotonic() - t0 < 60


def test_directory_without_config_is_rejected(tmp_path):
    assert "has no config.json" in _args(str(tmp_path))[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_gpu_requests_without_a_gpu_are_rejected():
    assert "no CUDA GPU is visible" in _args("--device", "cuda")[1]
    assert "--gpu-memory-utilization: GPU-only" in _args("--gpu-memory-utilization", "0.5")[1]
    out = _run("--device", "cuda:0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
