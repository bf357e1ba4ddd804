"""Every launch config shipped in autotune/tables for attention.decode computes the same
function as the reference (the tables were timed on the H200; correctness is checked here, in
the interpreter on CPU and on the GPU in the GPU tier)."""
from __future__ import annotations

import json

import pytest
import torch

from autotune.cache import SHIPPED
from tskernels.numerics import assert_close
from tskernels.ops.attention.triton_decode import TUNE_KERNEL, DecodePlan
from tskernels.testing.problems import poisoned_like

try:
    from .test_attention_common import make_paged, q_dtypes, ref_decode
except ImportError:
    from test_attention_common import make_paged, q_dtypes, ref_decode

ENTRIES = sorted({json.dumps({k: v for k, v in cfg.items()
                              if k in ("num_splits", "block_n", "num_warps", "num_stages")},
                             sort_keys=True) + ("|fp8" if "-fp8-" in key else "|bf16")
                  for table in SHIPPED.glob("*.json")
                  for key, cfg in json.loads(table.read_text()).get(TUNE_KERNEL, {}).items()})


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
    assert plan.num_splits == cfg["num_splits"] and plan.block_n == cfg["block_n"]
    out = poisoned_like(q)
    plan.run(q, kvp.k_cache, kvp.v_cache, k_scale=kvp.k_scale, v_scale=kvp.v_scale, out=out)
    truth, same = ref_decode(q, kvp, k_scale=kvp.k_scale, v_scale=kvp.v_scale)
    assert_close(out, truth, baseline=same, name=f"decode {entry}")


def test_plan_picks_up_shipped_entry(monkeypatch):
    """On a device whose key has a table entry, the plan uses it (no explicit config given)."""
    import tskernels.ops.attention.triton_decode as td

    seen = {}

    def fake_tuned(device, head_dim, kv_dtype, group, bh, max_len):
        seen["key"] = td.tune_key(head_dim, "bf16", group, bh, max_len)
        return {"num_splits": 5, "block_n": 32, "num_warps": 4, "num_stages": 2}

    monkeypatch.setattr(td, "_tuned", fake_tuned)
    pt = torch.zeros(16, 256, dtype=torch.int32)
    plan = DecodePlan(pt, torch.zeros(16, dtype=torch.int32), num_q_heads=32, num_kv_heads=8,
                      head_dim=128, page_size=16, q_dtype=torch.float16,
                      kv_dtype=torch.float16, scale=0.1)
    assert (plan.num_splits, plan.block_n, plan.num_stages) == (5, 32, 2)
    assert seen["key"] == "d128-bf16-g4-bh128-L4096"
