"""GPU tier: tuning a real kernel on the device picks a config that computes the reference's
result and is at least as fast as the kernel's heuristic, timed side by side after tuning
(CUDA-graph replays: eager timings of these ~10 us kernels measure the host's launch path)."""
from __future__ import annotations

import statistics

import pytest
import torch

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import Target, cuda_graph_timer, spaces, tune_bucket

CASES = [("norm.rmsnorm.triton", {"N": 4096, "rows": 32, "dtype": "bfloat16"}),
         ("activation.silu_and_mul.triton", {"I": 14336, "rows": 16, "dtype": "bfloat16"}),
         ("rope.apply_rope.triton", {"T": 256, "H": 32, "D": 128, "dtype": "bfloat16"})]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,problem", CASES)
def test_tuned_config_is_correct_and_not_slower(kernel, problem):
    ks = spaces()[kernel]
    major, minor = torch.cuda.get_device_capability()
    # a bounded draw (the heuristic + 7 others) keeps the tier's compile time small
    res = tune_bucket(ks, problem, ks.runner(problem, "cuda"), timer=cuda_graph_timer,
                      target=Target.for_arch(f"sm_{major}{minor}"), repeats=3, limit=8)
    assert not [c for c in res.candidates if c.error and c.error.startswith("wrong")], \
        "a config computed a wrong result"
    heur = ks.heuristic(problem)
    runner = ks.runner(problem, "cuda")
    assert runner.check(res.pick) and runner.check(heur)
    tuned_fn, heur_fn = runner.build(res.pick), runner.build(heur)
    t_tuned, t_heur = [], []
    for _ in range(5):                      # interleaved, so drift hits both alike
        t_tuned.append(cuda_graph_timer(tuned_fn))
        t_heur.append(cuda_graph_timer(heur_fn))
    tuned, base = statistics.median(t_tuned), statistics.median(t_heur)
    print(f"{kernel} {problem}: tuned {res.pick} {tuned:.2f} us, heuristic {heur} {base:.2f} us")
    assert tuned <= base * 1.05, (res.pick, tuned, heur, base)
