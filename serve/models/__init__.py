"""Model classes by HF architecture name (`MODELS`, `model_class`), found by importing every
module of this package once: each model module registers its classes with `@register_model`."""
from __future__ import annotations

import importlib
import pkgutil

from .registry import MODELS, model_class, register_model


def discover() -> dict[str, type]:
    """Import every module of `serve.models` (idempotent) and return `MODELS`."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return MODELS


discover()

__all__ = ["MODELS", "discover", "model_class", "register_model"]
