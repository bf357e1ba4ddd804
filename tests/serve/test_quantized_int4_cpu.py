"""Weight-only 4-bit serving of the default model on the CPU (`--quantization int4`).

The documented tolerance (docs/CPU.md), as for int8 (tests/serve/test_quantized_cpu.py): HF
transformers' SmolLM2-135M-Instruct with every Linear replaced by the 4-bit group weights that
serve.models.quant keeps (tskernels.gemm.quantize_q4_groups, groups of 32 along K) and the
tied logits projection by int8 per-row weights, against the same model in fp32, teacher forced
on the same fixed text: perplexity within 3 %, logits within 8 % relative RMS, the argmax
equal at >= 90 % of the positions. The checkpoint is itself the dequantized Q4_1 GGUF (4-bit
groups of 32 with the same asymmetric form), so re-quantizing it loses little. Then the engine
in int4 mode must produce HF's greedy tokens on those same weights.
"""
from __future__ import annotations

import math

import pytest
import torch

import tskernels
from serve.default_model import smollm2_dir
from serve.engine import Engine, SamplingParams

from .test_models_parity import hf_greedy
from .test_quantized_cpu import LOGIT_REL_RMS, PPL_RATIO, TEXT, TOP1_AGREE, _hf


def _dequant(q, scale, mins):
    n, half = q.shape
    g = q.view(n, half // 16, 16)
    nib = torch.cat([g & 15, g >> 4], dim=2).float()
    return (nib * scale[..., None] + mins[..., None]).reshape(n, 2 * half)


@pytest.fixture(scope="module")
def hf_int4():
    m = _hf(False)
    head = m.lm_head.weight.data.clone()  # tied: the embedding keeps its fp32 table
    for mod in m.modules():
        if isinstance(mod, torch.nn.Linear) and mod is not m.lm_head:
            mod.weight.data = _dequant(*tskernels.gemm.quantize_q4_groups(mod.weight.data))
    q, s = tskernels.gemm.quantize_int8_per_channel(head)
    m.lm_head.weight = torch.nn.Parameter(q.float() * s[:, None], requires_grad=False)
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
    assert rel <= LOGIT_REL_RMS, rel
    assert agree >= TOP1_AGREE, agree


def test_engine_int4_is_hf_on_the_int4_weights(hf_int4):
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
    for o, p in zip(outs, prompts):
        assert o.token_ids == hf_greedy(hf_int4, p, 24)
    assert "Paris" in outs[0].text


def test_int4_resolution():
    from serve.models import quant

    assert quant.resolve("int4", device=torch.device("cpu"), dtype_arg="auto") == "int4"
    with pytest.raises(ValueError, match="CPU only"):
        quant.resolve("int4", device=torch.device("cuda"), dtype_arg="auto")
