"""Every launch config shipped in autotune/tables for attention.decode computes the same
function as the reference (the tables were timed on the H200; correctness is checked here, in
the interpreter on CPU and on the GPU in the GPU tier)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from autotune import Lookup, StaleTableWarning, Table, Tables, parse_bucket
from autotune.cache import SHIPPED
from tskernels.numerics import assert_close
from tskernels.ops.attention.triton_decode import TUNE_KERNEL, DecodePlan
from tskernels.testing.problems import poisoned_like

try:
    from .test_attention_common import make_paged, q_dtypes, ref_decode
except ImportError:
    from test_attention_common import make_paged, q_dtypes, ref_decode

ENTRIES = sorted({json.dumps({k: v for k, v in e.config.items()
                              if k in ("num_splits", "block_n", "num_warps", "num_stages")},
                             sort_keys=True) + "|" + parse_bucket(e.bucket)["kv"]
                  for table in SHIPPED.glob("*.json")
                  for e in Table.load(table).for_kernel(TUNE_KERNEL)})


def test_shipped_entries_are_current():
    """The shipped entries match the kernel's source and this Triton: a kernel change that was
    not re-tuned (python -m autotune tune attention.decode) fails here, not silently at run time."""
    import tskernels.ops.attention.triton_decode as td
    src = td.SPACE.source_hash()
    for table in SHIPPED.glob("*.json"):
        for e in Table.load(table).for_kernel(TUNE_KERNEL):
            assert e.source_hash == src, (table.name, e.bucket, e.source_hash, src)
            assert e.versions.get("triton") in (None, __import__("triton").__version__), e.versions
    assert ENTRIES


@pytest.mark.parametrize("entry", ENTRIES)
def test_shipped_decode_config(kernel_device, entry):
    cfg, kv = entry.split("|")
    cfg = json.loads(cfg)
    dtype = q_dtypes(kernel_device)[0]
    gen = torch.Generator().manual_seed(3)
    lens = [0, 1, 77, 300, 129]
    kvp = make_paged(lens, 16, 2, 128, dtype, "per_tensor" if kv == "fp8" else None,
                     kernel_device, gen)
    q = torch.randn(len(lens), 8, 128, generator=gen).to(kernel_device, dtype)
    plan = DecodePlan(kvp.page_table, kvp.seq_lens, num_q_heads=8, num_kv_heads=2, head_dim=128,
                      page_size=16, q_dtype=dtype, kv_dtype=kvp.k_cache.dtype, scale=128 ** -0.5,
                      **cfg)
    if cfg:   # ({} = the plan's own choice: a tuned "keep the heuristic")
        assert plan.num_splits == cfg["num_splits"] and plan.block_n == cfg["block_n"]
    out = poisoned_like(q)
    plan.run(q, kvp.k_cache, kvp.v_cache, k_scale=kvp.k_scale, v_scale=kvp.v_scale, out=out)
    truth, same = ref_decode(q, kvp, k_scale=kvp.k_scale, v_scale=kvp.v_scale)
    assert_close(out, truth, baseline=same, name=f"decode {entry}")


def test_plan_picks_up_shipped_entry(monkeypatch):
    """On a device whose key has a table entry, the plan uses it (no explicit config given)."""
    import tskernels.ops.attention.triton_decode as td

    seen = {}

    from autotune import Choice, bucket_str

    def fake_tuned(device, head_dim, kv_dtype, group, bh, max_len):
        seen["key"] = bucket_str(td.SPACE.bucket(td.tune_problem(head_dim, "bf16", group, bh,
                                                                 max_len)))
        return Choice({"num_splits": 5, "block_n": 32, "num_warps": 4, "num_stages": 2},
                      "exact", td.TUNE_KERNEL, seen["key"], "nvidia-h200")

    monkeypatch.setattr(td, "_tuned", fake_tuned)
    pt = torch.zeros(16, 256, dtype=torch.int32)
    plan = DecodePlan(pt, torch.zeros(16, dtype=torch.int32), num_q_heads=32, num_kv_heads=8,
                      head_dim=128, page_size=16, q_dtype=torch.float16,
                      kv_dtype=torch.float16, scale=0.1)
    assert (plan.num_splits, plan.block_n, plan.num_stages) == (5, 32, 2)
    assert seen["key"] == "L=4096,bh=128,d=128,g=4,kv=bf16"
    assert plan.tuned_from == "exact" and "tuned_from='exact'" in repr(plan)


def test_h200_entries_serve_an_h100_through_the_family():
    """A simulated H100 has no table: the H200's entries reach it through the hopper family."""
    import tskernels.ops.attention.triton_decode as td
    look = Lookup(Tables(SHIPPED / "_no_user_dir_", SHIPPED))
    prob = td.tune_problem(128, "bf16", 4, 512, 4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleTableWarning)
        got = look.choose(td.SPACE, prob, "nvidia-h100-80gb-hbm3", record=False)
        assert got.link == "family:nvidia-h200" and got.config["num_splits"] == 1
        assert look.choose(td.SPACE, prob, "nvidia-h200", record=False).link == "exact"
    assert look.choose(td.SPACE, prob, "amd-mi300x", record=False).link == "heuristic"


def test_other_head_dims_and_oversized_configs_never_borrow_entries():
    """d=256 (or an fp32 cache) has no tuned entries: the d=128 ones must not be taken as
    "nearest" (their stages would not fit in shared memory), and a config that does not fit
    the problem on the target is passed over even at its exact bucket."""
    import tskernels.ops.attention.triton_decode as td
    from autotune import Target
    look = Lookup(Tables(SHIPPED / "_no_user_dir_", SHIPPED))
    h200 = Target.for_arch("sm_90")
    for kv, d in (("bf16", 256), ("fp8", 256), ("fp32", 128), ("bf16", 64)):
        got = look.choose(td.SPACE, td.tune_problem(d, kv, 4, 512, 4096), "nvidia-h200",
                          record=False, target=h200)
        assert got.link == "heuristic" and got.config == {}, (kv, d, got.explain())
    tiny = Target("nvidia", "sm_90", 16 * 1024, 32)          # 16 KB: no shipped config fits
    got = look.choose(td.SPACE, td.tune_problem(128, "bf16", 4, 512, 4096), "nvidia-h200",
                      record=False, target=tiny)
    assert got.link == "heuristic" and any("does not fit" in s for s in got.skipped)
