"""The served model classes, keyed by the HF architecture names they implement.

A model module declares its class with `@register_model("XForCausalLM", ...)`; the package
imports every module of `serve/models/` once (`serve.models.discover`), so a new model is its
file (plus its config rules in `serve/model_support.py` and its parity test) and no list.
"""
from __future__ import annotations

MODELS: dict[str, type] = {}


def register_model(*architectures: str):
    """Class decorator: serve `cls` for each HF `architectures` name (unique across models)."""
    if not architectures or not all(isinstance(a, str) and a for a in architectures):
        raise TypeError("register_model: give one or more HF architecture names, "
                        f"got {architectures!r}")

    def deco(cls: type) -> type:
        for arch in architectures:
            prev = MODELS.get(arch)
            if prev is not None and prev is not cls:
                raise ValueError(f"register_model: {arch!r} is already served by "
                                 f"{prev.__module__}.{prev.__qualname__}")
            MODELS[arch] = cls
        return cls

    return deco


def model_class(cfg) -> type:
    """The class serving `cfg` (its first served entry of `cfg.architectures`)."""
    for arch in getattr(cfg, "architectures", None) or []:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(f"model: architectures {getattr(cfg, 'architectures', None)} not supported; "
                     f"supported: {sorted(MODELS)}")
