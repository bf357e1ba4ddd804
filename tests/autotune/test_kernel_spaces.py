"""Every tunable kernel declares its space: valid buckets, a heuristic that is inside the space
and survives pruning on the targets it compiles for, a source hash that ignores comments, and
a runner whose reference check passes for the heuristic config (the interpreter on the CPU)."""
from __future__ import annotations

import pytest

import tskernels.ops  # noqa: F401  (declares the spaces)
from autotune import Target, jit_source, spaces

DECLARED = sorted(spaces())
# Kernels the tuning issue lists; each must declare a space.
REQUIRED = ("attention.decode.triton", "attention.extend.triton", "attention.merge_states.triton",
            "attention.store_kv.triton", "mla.decode.triton", "mla.extend.triton",
            "norm.rmsnorm.triton", "rope.apply_rope.triton", "activation.silu_and_mul.triton",
            "gemm.mm.triton", "gemm.gemv.triton", "gemm.fp8_block_mm.triton",
            "gemm.fp8_stream.triton", "moe.fused_experts.triton", "sampling.greedy.triton",
            "gdn.decode_step.triton", "gdn.chunk_prefill.triton")


def test_required_kernels_declare_spaces():
    missing = [k for k in REQUIRED if k not in DECLARED]
    assert not missing, missing


@pytest.mark.parametrize("kernel", DECLARED)
def test_space_is_consistent(kernel):
    ks = spaces()[kernel]
    assert ks.example is not None, f"{kernel}: declare an example problem"
    dims = ks.bucket(ks.example)
    assert dims and all(isinstance(v, (int, str)) for v in dims.values())
    heur = ks.heuristic(ks.example)
    configs = list(ks.space_for("nvidia"))
    if heur:                                # {} = the kernel's plan decides (no override)
        assert heur in configs, (kernel, heur)
        keep, pruned = ks.candidates(ks.example, Target.for_arch("sm_90"))
        assert heur in keep, (kernel, heur, [p for p in pruned if p["config"] == heur])
    assert ks.source_hash() and len(ks.source_hash()) == 16


def test_source_hash_ignores_comments_and_blank_lines():
    class Fn:
        __globals__ = {}

        def __init__(self, src):
            self.src = src
    a = Fn("def k(x):\n    y = x + 1  # why\n\n    return y\n")
    b = Fn("def k(x):\n    # reworded\n    y = x + 1\n    return y")
    c = Fn("def k(x):\n    y = x + 2\n    return y")
    assert jit_source(a) == jit_source(b) != jit_source(c)


@pytest.mark.parametrize("kernel", [k for k in DECLARED if spaces()[k].runner is not None])
def test_runner_checks_heuristic_config(kernel, kernel_device):
    ks = spaces()[kernel]
    small = {k: (min(v, 64) if isinstance(v, int) else v) for k, v in ks.example.items()}
    if "dtype" in small and kernel_device == "cpu":
        small["dtype"] = "float32"                    # bf16 is not trustworthy in the interpreter
    runner = ks.runner(small, kernel_device)
    cfg = ks.heuristic(small)
    assert runner.check(cfg)
    runner.build(cfg)()
