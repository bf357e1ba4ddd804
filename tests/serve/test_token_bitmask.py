"""`apply_token_bitmask`: the grammar mask on the host and on the device (the device branch
uploads the packed words and unpacks them there; GPU tier). No grammar library needed."""
from __future__ import annotations

import pytest
import torch

from serve.constrained import apply_token_bitmask


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="the device branch needs a CUDA device")])])
def test_apply_token_bitmask_matches_bits(device):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 70, generator=g)
    allowed = torch.rand(3, 70, generator=g) < 0.3
    words = torch.zeros(3, 3, dtype=torch.int64)
    for t in range(70):
        words[:, t // 32] |= allowed[:, t].long() << (t % 32)
    mask = ((words + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32).numpy()   # int32 bits
    out = apply_token_bitmask(logits.to(device), mask).cpu()
    assert torch.equal(out[allowed], logits[allowed])
    assert torch.isneginf(out[~allowed]).all()
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, mask[:, :2])
