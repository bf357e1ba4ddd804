"""Block-fp8 checkpoints in the HF layout (`weight` e4m3 + `weight_scale_inv`,
`quantization_config.weight_block_size`): loaded exactly, served (CPU: the reference ops),
and `dummy:` configs made fp8."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from serve.config import DUMMY_CONFIGS, load_model_config
from serve.engine import Engine, SamplingParams
from serve.model_support import UnsupportedConfigError, check_model_config
from serve.models import model_class
from serve.weights import build_model
from tskernels_ref.gemm import quantize_fp8_block

from .test_models_parity import make_hf_checkpoint

FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128]}
# tiny Qwen3-MoE whose fused q|k|v and gate|up shards fall on 128-row scale blocks
MOE = dict(num_key_value_heads=4, moe_intermediate_size=128)


def _quantized(name: str) -> bool:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
    return name.endswith(".weight") and leaf not in ("gate", "lm_head", "embed_tokens") \
        and "norm" not in leaf


def _fp8_checkpoint(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """Rewrite a float32 HF checkpoint as DeepSeek-style block fp8; returns the dequantized
    float32 tensors (the math the fp8 model computes with)."""
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    out, deq = {}, {}
    for name, t in tensors.items():
        if _quantized(name) and t.dim() == 2:
            q, s = quantize_fp8_block(t)
            out[name], out[name.removesuffix("weight") + "weight_scale_inv"] = q, s
            full = s.repeat_interleave(128, 0)[:t.shape[0]].repeat_interleave(128, 1)
            deq[name] = q.float() * full[:, :t.shape[1]]
        else:
            out[name] = deq[name] = t
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = FP8_QC
    (dst / "config.json").write_text(json.dumps(cfg))
    return deq


# tiny DeepSeek-V3 (MLA, sigmoid-grouped MoE, shared expert, a dense first layer) likewise
DSV3 = dict(moe_intermediate_size=128)


def _pair(tmp_path_factory, name, overrides):
    root = tmp_path_factory.mktemp(f"fp8-{name}")
    make_hf_checkpoint(name, root / "f32", **overrides)
    deq = _fp8_checkpoint(root / "f32", root / "fp8")
    # the same model in float32 with the dequantized weights (no quantization_config)
    save_file(deq, str(root / "f32" / "model.safetensors"))
    return root


@pytest.fixture(scope="module")
def qwen3_moe_fp8(tmp_path_factory):
    return _pair(tmp_path_factory, "tiny-qwen3-moe", MOE)


@pytest.fixture(scope="module")
def dsv3_fp8(tmp_path_factory):
    return _pair(tmp_path_factory, "tiny-deepseek-v3", DSV3)


def test_fp8_checkpoint_loads_exactly(qwen3_moe_fp8):
    cfg, path = load_model_config(str(qwen3_moe_fp8 / "fp8"))
    model = build_model(model_class(cfg), cfg, device="cpu", dtype=torch.float32,
                        max_position=256, checkpoint=path)
    saved = load_file(str(qwen3_moe_fp8 / "fp8" / "model.safetensors"))
    layer = model.layers[0]
    e = layer.mlp.experts
    assert e.w13.dtype == torch.float8_e4m3fn and e.w13_scale_inv.dtype == torch.float32
    pre = "model.layers.0.mlp.experts.3."
    i = e.inter
    assert torch.equal(e.w13[3, :i].view(torch.uint8), saved[pre + "gate_proj.weight"].view(
        torch.uint8))
    assert torch.equal(e.w13_scale_inv[3, i // 128:], saved[pre + "up_proj.weight_scale_inv"])
    assert torch.equal(e.w2_scale_inv[3], saved[pre + "down_proj.weight_scale_inv"])
    qkv = layer.self_attn.qkv_proj
    assert torch.equal(qkv.weight_scale_inv[1:2],
                       saved["model.layers.0.self_attn.k_proj.weight_scale_inv"])
    assert layer.mlp.gate.weight.dtype == torch.float32  # routers stay unquantized
    assert model.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize("pair", ["qwen3_moe_fp8"])
def test_fp8_model_serves_like_its_dequantized_weights(pair, request):
    """Greedy tokens of the fp8 model (activations quantized per 1 x 128 group on the fly)
    equal those of the float32 model holding the dequantized weights, over the first steps."""
    root = request.getfixturevalue(pair)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (20, 7)]
    p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    got = [o.token_ids for o in Engine(str(root / "fp8"), dtype="float32",
                                       device="cpu", page_size=4).generate(prompts, p)]
    want = [o.token_ids for o in Engine(str(root / "f32"), dtype="float32",
                                        device="cpu", page_size=4).generate(prompts, p)]
    assert got == want


def test_dsv3_fp8_checkpoint_loads(dsv3_fp8):
    cfg, path = load_model_config(str(dsv3_fp8 / "fp8"))
    model = build_model(model_class(cfg), cfg, device="cpu", dtype=torch.float32,
                        max_position=256, checkpoint=path)
    moe_layer = model.layers[1].mlp
    assert moe_layer.experts.w13.dtype == torch.float8_e4m3fn
    assert moe_layer.shared_experts.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    assert moe_layer.gate.weight.dtype == torch.float32  # the router stays dense
    attn = model.layers[0].self_attn
    assert attn.kv_b_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.w_uk.dtype == torch.float32  # absorbed from the dequantized kv_b_proj


def test_dsv3_fp8_modules_match_dequantized_weights(dsv3_fp8):
    """Every fp8 projection and the fp8 experts of tiny DeepSeek-V3 against the same module
    holding the dequantized weights, within the fp8 tolerance (the difference is the 1 x 128
    activation quantization). Its greedy tokens are not compared: three random layers with
    narrow logit margins turn the ~2.5 % per-projection activation rounding into other
    tokens, which says nothing about the loading."""
    import tskernels
    from serve.models.layers import Linear
    from tskernels.numerics import assert_close

    models = []
    for sub in ("fp8", "f32"):
        cfg, path = load_model_config(str(dsv3_fp8 / sub))
        models.append(dict(build_model(model_class(cfg), cfg, device="cpu",
                                       dtype=torch.float32, max_position=256,
                                       checkpoint=path).named_modules()))
    fp8, dense = models
    g = torch.Generator().manual_seed(0)
    n = 0
    for name, mod in fp8.items():
        if isinstance(mod, Linear) and mod.weight_scale_inv is not None:
            x = torch.randn(3, mod.weight.shape[1], generator=g)
            assert_close(mod(x), dense[name](x).double(), torch.float8_e4m3fn, name=name)
            n += 1
    assert n >= 10
    e = fp8["layers.1.mlp.experts"]
    x = torch.randn(4, 128, generator=g)
    w, ids = tskernels.moe.topk_softmax(torch.randn(4, e.num_experts, generator=g), 2)
    assert_close(e(x, w, ids), dense["layers.1.mlp.experts"](x, w, ids).double(),
                 torch.float8_e4m3fn)


def test_dummy_config_made_fp8(tmp_path):
    d = dict(DUMMY_CONFIGS["tiny-qwen3-moe"], **MOE, quantization_config=FP8_QC)
    spec = tmp_path / "tiny-qwen3-moe-fp8.json"
    spec.write_text(json.dumps(d))
    engine = Engine(f"dummy:{spec}", dtype="float32", device="cpu", page_size=4)
    e = engine.runner.model.layers[1].mlp.experts
    assert e.w13.dtype == torch.float8_e4m3fn
    assert torch.isfinite(e.w13_scale_inv).all() and (e.w13_scale_inv > 0).all()
    out = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, temperature=0.0,
                                                         ignore_eos=True))
    assert len(out[0].token_ids) == 3


@pytest.mark.parametrize("qc", [{"quant_method": "fp8"},
                                {**FP8_QC, "weight_block_size": [64, 64]},
                                {**FP8_QC, "activation_scheme": "static"},
                                {"quant_method": "awq", "bits": 4}])
def test_other_quantization_refused_by_name(qc):
    from transformers import AutoConfig

    d = dict(DUMMY_CONFIGS["tiny-qwen3-moe"], quantization_config=qc)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with pytest.raises(UnsupportedConfigError, match="quantization_config"):
        check_model_config(cfg)
