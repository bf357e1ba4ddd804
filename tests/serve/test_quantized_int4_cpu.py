"""Weight-only 4-bit serving of the default model on the CPU (`--quantization int4`).

The documented tolerance (docs/CPU.md), as for int8 (tests/serve/test_quantized_cpu.py): HF
transformers' SmolLM2-135M-Instruct with every Linear computed as the engine's int4 mode does
(4-bit group weights, tskernels.gemm.quantize_q4_groups, groups of 32 along K, times int8
activation groups: tskernels_ref.gemm.q4w_mm with act_int8) and the tied logits projection
by int8 per-row weights x int8 activation groups (tskernels_ref.gemm.int8w_mm act_int8), against the same model in fp32, teacher forced
on the same fixed text: perplexity within 3 %, logits within 12 % relative RMS (int8: 8 %), the
argmax equal at >= 90 % of the positions (measured: 12.42 -> 12.64, 9.4 %, 92 %; with float
activations the 4-bit weights alone give 12.39, 1.25 %, 100 %). The checkpoint is itself the dequantized Q4_1 GGUF (4-bit
groups of 32 with the same asymmetric form), so re-quantizing it loses little. Then the engine
in int4 mode must compute that HF model: each of its greedy tokens within 1 logit of that
model's argmax (exact equality is fragile under activation rounding, see the test).
"""
from __future__ import annotations

import math

import pytest
import torch

import tskernels
from serve.default_model import smollm2_dir
from serve.engine import Engine, SamplingParams

from .test_quantized_cpu import PPL_RATIO, TEXT, TOP1_AGREE, _hf

# int4's own logit bound, looser than int8's 8 %: the 8-bit activation groups (outliers in a
# group of 32 coarsen the others) cost more than the 4-bit weights (1.25 % rel. RMS with float
# activations); measured 9.4 %. Perplexity and argmax keep int8's bounds.
LOGIT_REL_RMS_INT4 = 0.12
MARGIN = 1.0  # logits, see test_engine_int4_computes_the_hf_int4_model


class _Q4Linear(torch.nn.Module):
    """An HF Linear as the engine's int4 mode computes it: 4-bit weights and int8 activation
    groups (tskernels_ref.gemm.q4w_mm with act_int8)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.q = tskernels.gemm.quantize_q4_groups(lin.weight.data)

    def forward(self, x):
        from tskernels_ref.gemm import q4w_mm

        y = q4w_mm(x.reshape(-1, x.shape[-1]).float(), *self.q, act_int8=True)
        return y.view(*x.shape[:-1], -1).to(x.dtype)


class _I8Head(torch.nn.Module):
    """The logits projection as int4 mode computes it: int8 per-row weights x int8 activation
    groups (tskernels_ref.gemm.int8w_mm with act_int8)."""

    def __init__(self, q, s):
        super().__init__()
        self.q, self.s = q, s

    def forward(self, x):
        from tskernels_ref.gemm import int8w_mm

        y = int8w_mm(x.reshape(-1, x.shape[-1]).float(), self.q, self.s, act_int8=True)
        return y.view(*x.shape[:-1], -1).to(x.dtype)


@pytest.fixture(scope="module")
def hf_int4():
    m = _hf(False)
    head = m.lm_head.weight.data.clone()  # tied: the embedding keeps its fp32 table
    for name, mod in list(m.named_modules()):
        for child, lin in list(mod.named_children()):
            if isinstance(lin, torch.nn.Linear) and lin is not m.lm_head:
                setattr(mod, child, _Q4Linear(lin))
    m.lm_head = _I8Head(*tskernels.gemm.quantize_int8_per_channel(head))
    return m


def test_int4_weights_within_documented_tolerance(hf_int4):
    from transformers import AutoTokenizer

    ids = torch.tensor([AutoTokenizer.from_pretrained(smollm2_dir()).encode(TEXT)])
    with torch.inference_mode():
        ref = _hf(False)(ids).logits[0, :-1].double()
        got = hf_int4(ids).logits[0, :-1].double()
    ppl = [math.exp(torch.nn.functional.cross_entropy(x, ids[0, 1:])) for x in (ref, got)]
    rel = float((got - ref).norm() / ref.norm())
    agree = float((got.argmax(-1) == ref.argmax(-1)).double().mean())
    print(f"int4: perplexity {ppl[0]:.3f} -> {ppl[1]:.3f}, logits {rel:.4f} rel RMS, "
          f"argmax agreement {agree:.3f}")
    assert abs(ppl[1] / ppl[0] - 1) <= PPL_RATIO, ppl
    assert rel <= LOGIT_REL_RMS_INT4, rel
    assert agree >= TOP1_AGREE, agree


def test_engine_int4_computes_the_hf_int4_model(hf_int4):
    engine = Engine("default", device="cpu", quantization="int4", chunked_prefill_size=48)
    assert engine.quantization == "int4"
    lin = engine.model.layers[0].mlp.gate_up_proj
    assert lin.q4[0].dtype == torch.uint8 and lin.weight.numel() == 0  # float weight freed
    assert lin.int8 is None and engine.model.int8_lm_head is not None
    prompts = [list(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_dict=True)["input_ids"]),
        engine.tokenizer(TEXT)["input_ids"]]
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0,
                                                   ignore_eos=True))
    # Rounding activations to int8 is discontinuous: float-order differences upstream flip a
    # few roundings, so exact token equality is fragile (the first token of the France prompt
    # is a 0.28-logit near-tie). Instead every engine token, teacher-forced through the HF
    # model of the same arithmetic, must be within MARGIN logits of that model's argmax.
    for o, p in zip(outs, prompts):
        seq = torch.tensor([p + list(o.token_ids)])
        with torch.inference_mode():
            lg = hf_int4(seq).logits[0, len(p) - 1:len(p) - 1 + len(o.token_ids)].double()
        gap = lg.max(-1).values - lg.gather(1, torch.tensor(o.token_ids)[:, None])[:, 0]
        assert float(gap.max()) <= MARGIN, gap
    assert "Paris" in outs[0].text


def test_int4_resolution():
    from serve.models import quant

    assert quant.resolve("int4", device=torch.device("cpu"), dtype_arg="auto") == "int4"
    with pytest.raises(ValueError, match="CPU only"):
        quant.resolve("int4", device=torch.device("cuda"), dtype_arg="auto")
