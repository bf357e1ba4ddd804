"""Weight-only int8 serving of the default model on the CPU (`--quantization int8`).

The documented tolerance (docs/CPU.md): HF transformers' SmolLM2-135M-Instruct with every
Linear and the logits projection replaced by the int8 per-row-scaled weights that
serve.models.quant keeps (embedding lookup in fp32) against the same model in fp32, teacher
forced on a fixed 75-token text: perplexity within 3 %, logits within 8 % relative RMS, the
argmax equal at >= 90 % of the positions (measured: 12.42 -> 12.41, 4.3 %, 96 %). Then the
engine in int8 mode must produce HF's greedy tokens on those same int8 weights: the engine's
int8 path computes that model, not another one.
"""
from __future__ import annotations

import math

import pytest
import torch

import tskernels
from serve.default_model import smollm2_dir
from serve.engine import Engine, SamplingParams

from .test_models_parity import hf_greedy

TEXT = ("The water cycle describes how water moves between the oceans, the air and the land. "
        "Sunlight warms the surface of the sea, and water evaporates into vapour. The vapour "
        "rises, cools and condenses into clouds. When the droplets grow heavy they fall as rain "
        "or snow, which runs off into rivers or soaks into the ground, and finally flows back to "
        "the sea.")
PPL_RATIO = 0.03
LOGIT_REL_RMS = 0.08
TOP1_AGREE = 0.90


def _hf(int8: bool):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    if int8:
        head = m.lm_head.weight.data.clone()  # tied: the embedding keeps its fp32 table
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not m.lm_head:
                q, s = tskernels.gemm.quantize_int8_per_channel(mod.weight.data)
                mod.weight.data = q.float() * s[:, None]
        q, s = tskernels.gemm.quantize_int8_per_channel(head)
        m.lm_head.weight = torch.nn.Parameter(q.float() * s[:, None], requires_grad=False)
    return m


@pytest.fixture(scope="module")
def hf_int8():
    return _hf(True)


@pytest.fixture(scope="module")
def engine_int8():
    return Engine("default", device="cpu", quantization="int8", chunked_prefill_size=48)


def test_int8_weights_within_documented_tolerance(hf_int8):
    from transformers import AutoTokenizer

    ids = torch.tensor([AutoTokenizer.from_pretrained(smollm2_dir()).encode(TEXT)])
    with torch.inference_mode():
        ref = _hf(False)(ids).logits[0, :-1].double()
        got = hf_int8(ids).logits[0, :-1].double()
    ppl = [math.exp(torch.nn.functional.cross_entropy(x, ids[0, 1:])) for x in (ref, got)]
    assert abs(ppl[1] / ppl[0] - 1) <= PPL_RATIO, ppl
    rel = float((got - ref).norm() / ref.norm())
    assert rel <= LOGIT_REL_RMS, rel
    agree = float((got.argmax(-1) == ref.argmax(-1)).double().mean())
    assert agree >= TOP1_AGREE, agree


def test_engine_int8_is_hf_on_the_int8_weights(engine_int8, hf_int8):
    assert engine_int8.quantization == "int8"
    lin = engine_int8.model.layers[0].mlp.gate_up_proj
    assert lin.int8[0].dtype == torch.int8 and lin.weight.numel() == 0  # float weight freed
    prompts = [list(engine_int8.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_dict=True)["input_ids"]),
        engine_int8.tokenizer(TEXT)["input_ids"]]
    outs = engine_int8.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0,
                                                        ignore_eos=True))
    for o, p in zip(outs, prompts):
        assert o.token_ids == hf_greedy(hf_int8, p, 24)
    assert "Paris" in outs[0].text


def test_quantization_resolution_and_bad_values():
    from serve.models import quant

    cpu = torch.device("cpu")
    assert quant.resolve("auto", device=cpu, dtype_arg="auto") == "int8"
    assert quant.resolve("auto", device=cpu, dtype_arg="float32") == "none"
    assert quant.resolve("auto", device=torch.device("cuda"), dtype_arg="auto") == "none"
    with pytest.raises(ValueError, match="CPU only"):
        quant.resolve("int8", device=torch.device("cuda"), dtype_arg="auto")
    with pytest.raises(ValueError, match="quantization"):
        Engine("default", device="cpu", quantization="int3")
