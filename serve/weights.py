"""Weights: a local HF directory (safetensors, with a progress bar) or random `dummy` weights.

Block-fp8 configs (HF `quantization_config` quant_method "fp8", weight_block_size [128, 128]):
the projections hold e4m3 weights and their float32 `weight_scale_inv` block scales, loaded as
the checkpoint stores them; dummy weights are drawn and quantized the same way.

Each HF tensor is copied into its parameter's rows (fused q|k|v, gate|up and stacked experts take
several); the elements written are counted per parameter, and a model with a parameter (or part
of one) that no checkpoint tensor wrote is refused.
"""
from __future__ import annotations

import glob
import os
import sys

import torch
from tqdm import tqdm

# HF names that carry no weights we need (rotary buffers, MTP layers we do not run).
_IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def build_model(cls, cfg, *, device, dtype, max_position: int, checkpoint: str | None,
                seed: int = 0, quantization: str = "none"):
    """Instantiate `cls(cfg)` on `device` in `dtype` (fp32 where the model asks), then load the
    checkpoint directory, or random weights when it is None. quantization "int8": the dense
    weights are then kept as int8 with per-row scales, "int4": as 4-bit groups of 32
    (serve.models.quant)."""
    from .models import layers

    layers.META_PARAMS = True
    try:
        with torch.device(device):
            model = cls(cfg, device=device, max_position=max_position)
            block = fp8_block_size(cfg)
            if block:
                to_fp8(model, block, _not_converted(cfg))
    finally:
        layers.META_PARAMS = False
    _materialize(model, torch.device(device), dtype)
    if checkpoint is None:
        init_dummy(model, cfg, seed)
    else:
        load_checkpoint(model, checkpoint)
    if hasattr(model, "post_load"):
        model.post_load()
    if quantization in ("int8", "int4"):
        from .models import quant

        (quant.quantize_int8 if quantization == "int8" else quant.quantize_int4)(model)
    elif quantization != "none":
        raise ValueError(f"quantization: expected 'none', 'int8' or 'int4', got "
                         f"{quantization!r}")
    return model.eval()


def _materialize(model, device: torch.device, dtype: torch.dtype) -> None:
    """Give every (meta) parameter of `model` uninitialized storage on `device` in its final
    dtype: its pinned `fixed_dtype`, float32 for the names the model lists in `fp32_params`,
    else `dtype`. A parameter shared by several modules (tied embeddings) stays one."""
    fp32 = getattr(model, "fp32_params", ())
    names = {id(p): n for n, p in model.named_parameters()}
    made: dict[int, torch.nn.Parameter] = {}
    for mod in model.modules():
        for key, p in list(mod._parameters.items()):
            if p is None:
                continue
            q = made.get(id(p))
            if q is None:
                fixed = getattr(p, "fixed_dtype", None)
                dt = fixed or (torch.float32 if names[id(p)].endswith(fp32) else dtype)
                q = torch.nn.Parameter(torch.empty(p.shape, dtype=dt, device=device),
                                       requires_grad=False)
                if fixed is not None:
                    q.fixed_dtype = fixed
                made[id(p)] = q
            mod._parameters[key] = q


def fp8_block_size(cfg) -> int | None:
    """The weight block of an HF block-fp8 config (`quantization_config` with quant_method
    "fp8" and weight_block_size [b, b]), else None. serve.model_support refuses other
    quantization configs before this runs."""
    qc = getattr(cfg, "quantization_config", None)
    if not qc:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    return int(qc["weight_block_size"][0])


def _not_converted(cfg) -> tuple[str, ...]:
    qc = getattr(cfg, "quantization_config", None) or {}
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    return tuple(qc.get("modules_to_not_convert") or ())


def to_fp8(model, block: int, skip: tuple[str, ...] = ()) -> None:
    """Give every projection of `model` block-fp8 weights (the HF fp8 checkpoint layout), as
    the checkpoints quantize them: not the LM head, not the MoE routers (`.gate`), not the
    modules the config lists in modules_to_not_convert."""
    from .models.layers import Experts, Linear

    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        hf = f"model.{name}"
        if leaf in ("gate", "lm_head") or any(s in (name, hf) or hf.startswith(s + ".")
                                              for s in skip):
            continue
        if isinstance(mod, (Linear, Experts)):
            mod.to_fp8(block)


def _init_fp8(model, std: float, gen_for) -> set[int]:
    """Random fp8 weights: N(0, std) drawn in float32 one matrix at a time, quantized per
    block (tskernels.gemm.quantize_fp8_block) into the weight and its scales. Returns the ids
    of the parameters it wrote."""
    import tskernels

    from .models.layers import Experts, Linear

    done: set[int] = set()

    def fill(w, scale, block):
        g = gen_for(w.device)
        q, s = tskernels.gemm.quantize_fp8_block(
            torch.empty(w.shape, device=w.device).normal_(0.0, std, generator=g), block)
        w.copy_(q)
        scale.copy_(s)

    for mod in model.modules():
        if isinstance(mod, Linear) and mod.weight_scale_inv is not None:
            fill(mod.weight.data, mod.weight_scale_inv.data, mod.block)
            done |= {id(mod.weight), id(mod.weight_scale_inv)}
        elif isinstance(mod, Experts) and mod.w13_scale_inv is not None:
            for e in range(mod.num_experts):
                fill(mod.w13.data[e], mod.w13_scale_inv.data[e], mod.block)
                fill(mod.w2.data[e], mod.w2_scale_inv.data[e], mod.block)
            done |= {id(mod.w13), id(mod.w2), id(mod.w13_scale_inv), id(mod.w2_scale_inv)}
    return done


def init_dummy(model, cfg, seed: int) -> None:
    """Random weights that keep activations well scaled: N(0, std) matrices (block-fp8
    quantized for an fp8 config), unit norms, a zero routing bias. Drawn on the parameters'
    device (fast for 8B-size dummies)."""
    std = float(getattr(cfg, "initializer_range", 0.02) or 0.02)
    gens = {}

    def gen_for(device):
        return gens.setdefault(device, torch.Generator(device=device).manual_seed(seed))

    fp8_done = _init_fp8(model, std, gen_for)
    for name, p in model.named_parameters():
        if id(p) in fp8_done:
            continue
        if name.endswith("e_score_correction_bias"):
            p.data.zero_()
        elif p.dim() == 1:
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, std, generator=gen_for(p.device))


PROGRESS_ENV = "TSKERNELS_PROGRESS"   # "1": bars on, "0": off, unset / "auto": on a TTY
PROGRESS_MININTERVAL_S = 0.5


def progress_enabled(stream=None) -> bool:
    """Whether start-up progress bars (weight loading, the GGUF conversion) are drawn on
    `stream` (default stderr): TSKERNELS_PROGRESS=1 forces them, =0 turns them off; otherwise
    only on a terminal, so redirected logs (a service, CI, `2> file`) keep one line per event."""
    mode = os.environ.get(PROGRESS_ENV, "auto").strip().lower()
    if mode in ("1", "on", "true", "yes"):
        return True
    if mode in ("0", "off", "false", "no"):
        return False
    if mode not in ("", "auto"):
        raise ValueError(f"{PROGRESS_ENV}: expected 1, 0 or auto, got {mode!r}")
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(iterable=None, *, desc: str, unit: str, total: float | None = None,
                 unit_scale: bool = False, file=None):
    """The one progress-bar style of start-up (tqdm on stderr, redrawn at most every
    PROGRESS_MININTERVAL_S, cleared when done: the log line that follows says what happened);
    a no-op bar where `progress_enabled` says no."""
    return tqdm(iterable, desc=desc, unit=unit, total=total, unit_scale=unit_scale,
                mininterval=PROGRESS_MININTERVAL_S, leave=False, file=file,
                disable=not progress_enabled(file))


def _tensor_bytes(file: str) -> int:
    """Bytes of tensor data in a safetensors file: its size less the 8-byte length and the
    JSON header that length names."""
    with open(file, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return os.path.getsize(file) - 8 - header


def checkpoint_tensors(path: str, progress_file=None):
    """(name, tensor) for every tensor of the directory's safetensors files, with a progress
    bar over the tensor bytes (advanced once the consumer has taken each tensor)."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    total = sum(_tensor_bytes(f) for f in files)
    desc = f"Loading weights ({len(files)} files)" if len(files) > 1 else "Loading weights"
    with progress_bar(desc=desc, unit="B", total=total, unit_scale=True,
                      file=progress_file) as bar:
        for f in files:
            with safe_open(f, framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    t = st.get_tensor(name)
                    yield name, t
                    bar.update(t.numel() * t.element_size())


def load_checkpoint(model, path: str) -> None:
    wmap = model.hf_weight_map()
    tied = getattr(model, "tie", False)
    written: dict[int, int] = {}
    for name, t in checkpoint_tensors(path):
        target = wmap.get(name)
        if target is None:
            if name.endswith(_IGNORED) or (tied and name == "lm_head.weight") \
                    or _is_extra_layer(name, model):
                continue
            raise ValueError(f"{path}: checkpoint tensor {name!r} has no place in "
                             f"{type(model).__name__}")
        param, expert, off, rows = target
        dst = param if expert is None else param[expert]
        dst = dst if off is None else dst[off:off + rows]
        if tuple(dst.shape) != tuple(t.shape):
            raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, the model expects "
                             f"{tuple(dst.shape)}")
        dst.copy_(t)
        written[id(param)] = written.get(id(param), 0) + dst.numel()
    missing = [n for n, p in model.named_parameters() if written.get(id(p), 0) < p.numel()]
    if missing:
        raise ValueError(f"{path}: no checkpoint values for {missing[:8]}"
                         + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))


def _is_extra_layer(name: str, model) -> bool:
    """DeepSeek checkpoints carry MTP layers past num_hidden_layers; we do not run them."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2]) >= len(model.layers)
    return False
