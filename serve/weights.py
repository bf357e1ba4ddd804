"""Weights: a local HF directory (safetensors, with a progress bar) or random `dummy` weights.

Each HF tensor is copied into its parameter's rows (fused q|k|v, gate|up and stacked experts take
several); the elements written are counted per parameter, and a model with a parameter (or part
of one) that no checkpoint tensor wrote is refused.
"""
from __future__ import annotations

import glob
import os

import torch
from tqdm import tqdm

# HF names that carry no weights we need (rotary buffers, MTP layers we do not run).
_IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def build_model(cls, cfg, *, device, dtype, max_position: int, checkpoint: str | None,
                seed: int = 0):
    """Instantiate `cls(cfg)` on `device` in `dtype` (fp32 where the model asks), then load the
    checkpoint directory, or random weights when it is None."""
    with torch.device(device):
        model = cls(cfg, device=device, max_position=max_position)
    fp32 = getattr(model, "fp32_params", ())
    for name, p in model.named_parameters():
        p.data = torch.empty_like(p, dtype=torch.float32 if name.endswith(fp32) else dtype)
    if checkpoint is None:
        init_dummy(model, cfg, seed)
    else:
        load_checkpoint(model, checkpoint)
    if hasattr(model, "post_load"):
        model.post_load()
    return model.eval()


def init_dummy(model, cfg, seed: int) -> None:
    """Random weights that keep activations well scaled: N(0, std) matrices, unit norms,
    a zero routing bias. Drawn on the parameters' device (fast for 8B-size dummies)."""
    std = float(getattr(cfg, "initializer_range", 0.02) or 0.02)
    gens = {}
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            p.data.zero_()
        elif p.dim() == 1:
            p.data.fill_(1.0)
        else:
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            p.data.normal_(0.0, std, generator=gen)


def checkpoint_tensors(path: str):
    """(name, tensor) for every tensor of the directory's safetensors files, with a progress bar."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    with tqdm(total=len(files), desc="Loading weights", unit="file",
              disable=len(files) < 2 and os.environ.get("TSKERNELS_PROGRESS") != "1") as bar:
        for f in files:
            with safe_open(f, framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, st.get_tensor(name)
            bar.update(1)


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
