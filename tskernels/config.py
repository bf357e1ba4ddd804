"""Selection overrides: per call, context manager, environment variable, TOML file.

Strongest first:
1. the per-call `backend=` argument of any public op;
2. `with tskernels.use_backend("triton"):` or `use_backend({"attention.decode": "triton"})`
   (nested blocks: the innermost wins), also `use_backend(objective="latency")`;
3. TSKERNELS_BACKEND, e.g. `attention.decode=triton,norm=reference` or just `triton`, plus
   TSKERNELS_OBJECTIVE and TSKERNELS_ALLOW_UNVERIFIED=1;
4. the TOML file named by TSKERNELS_CONFIG:

       objective = "latency"
       allow_unverified = false
       [backend]
       "attention.decode" = "triton"
       norm = "reference"

A key may be "family.op" (strict: the backend must exist), "family" or "*" (applies only to
ops that have that backend). An override that names a backend which cannot run on the device
raises: an explicit request never silently falls back.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from pathlib import Path

from .policy import KernelPolicy

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Resolved:
    backend: str | None
    source: str
    strict: bool
    objective: str
    allow_unverified: bool
    # soft preferences of an active KernelPolicy (first that can run the problem wins), used
    # only when no backend is named
    prefer: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Layer:
    backends: tuple[tuple[str, str], ...]
    objective: str | None
    allow_unverified: bool | None
    source: str
    policy: KernelPolicy | None = None


_stack: contextvars.ContextVar[tuple[_Layer, ...]] = contextvars.ContextVar(
    "tskernels_overrides", default=())
_toml_cache: dict[str, tuple[float, _Layer]] = {}


def _parse_mapping(spec: str | dict | None) -> tuple[tuple[str, str], ...]:
    if spec is None:
        return ()
    if isinstance(spec, str):
        items = []
        for part in filter(None, (s.strip() for s in spec.split(","))):
            key, _, val = part.rpartition("=")
            items.append((key.strip() or "*", val.strip()))
        return tuple(items)
    return tuple((str(k), str(v)) for k, v in spec.items())


@contextlib.contextmanager
def use_backend(backends: str | dict | KernelPolicy | None = None, *,
                objective: str | None = None, allow_unverified: bool | None = None):
    """Override selection inside a `with` block (context-local, so threads and tasks are
    isolated). `backends`: a backend name for everything, {"family.op"|"family"|"*": name},
    or a `KernelPolicy` (soft preferences: used where they can run, see `tskernels.policy`)."""
    _check_objective(objective)
    if isinstance(backends, KernelPolicy):
        layer = _Layer((), objective, allow_unverified, repr(backends), backends)
    else:
        layer = _Layer(_parse_mapping(backends), objective, allow_unverified, "use_backend()")
    token = _stack.set(_stack.get() + (layer,))
    try:
        yield
    finally:
        _stack.reset(token)


def _check_objective(objective: str | None) -> None:
    from .registry import OBJECTIVES
    if objective is not None and objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


def _truthy(v: str | None) -> bool | None:
    if v is None or v == "":
        return None
    return v.lower() in ("1", "true", "yes", "on")


_ENV_KEYS = ("TSKERNELS_BACKEND", "TSKERNELS_OBJECTIVE", "TSKERNELS_ALLOW_UNVERIFIED",
             "TSKERNELS_CONFIG")
_env_snapshot: tuple | None = None
_env_layers: tuple[_Layer, ...] = ()


def reload() -> None:
    """Forget the environment/TOML overrides read so far (they are re-read on next use)."""
    global _env_snapshot
    _env_snapshot = None
    _toml_cache.clear()


def _global_layers() -> tuple[_Layer, ...]:
    """Environment and TOML layers. The environment is read through its raw dict and compared
    with the last snapshot, so an unchanged environment costs one tuple build per call."""
    global _env_snapshot, _env_layers
    raw = os.environ._data  # bytes -> bytes; avoids os.environ's per-key str encoding
    snap = tuple(raw.get(k.encode()) for k in _ENV_KEYS)
    if snap != _env_snapshot or snap[3] is not None:
        layers = tuple(x for x in (_env_layer(), _toml_layer()) if x is not None)
        for layer in layers:
            _check_names(layer)
        _env_layers, _env_snapshot = layers, snap
    return _env_layers


_checked: set[tuple] = set()


def _check_names(layer: _Layer) -> None:
    """Every `target=backend` of an environment / TOML layer names a registered op (or family,
    or `*`) and a backend registered for it somewhere; a typo is an error, not a silent
    fallback to the default choice."""
    if not layer.backends or layer.backends in _checked:
        return
    from . import registry
    registry._ensure_loaded()
    ops = registry._kernels
    for target, name in layer.backends:
        if target == "*":
            scope = [k for ks in ops.values() for k in ks]
        elif "." in target:
            scope = list(ops.get(tuple(target.split(".", 1)), ()))
        else:
            scope = [k for (f, _), ks in ops.items() if f == target for k in ks]
        if not scope:
            known = sorted({f for f, _ in ops} | {f"{f}.{o}" for f, o in ops})
            raise ValueError(f"{layer.source}: {target!r} is not a registered family or "
                             f"family.op; known: {known}")
        names = sorted({k.backend for k in scope})
        if name not in names:
            raise ValueError(f"{layer.source}: backend {name!r} for {target!r} is not "
                             f"registered; expected one of {names}")
    _checked.add(layer.backends)


def _env_layer() -> _Layer | None:
    b = os.environ.get("TSKERNELS_BACKEND")
    o = os.environ.get("TSKERNELS_OBJECTIVE") or None
    a = _truthy(os.environ.get("TSKERNELS_ALLOW_UNVERIFIED"))
    if b is None and o is None and a is None:
        return None
    return _Layer(_parse_mapping(b), o, a, "TSKERNELS_BACKEND")


def _toml_layer() -> _Layer | None:
    path = os.environ.get("TSKERNELS_CONFIG")
    if not path:
        return None
    p = Path(path)
    try:
        mtime = p.stat().st_mtime
    except OSError as e:
        raise FileNotFoundError(f"TSKERNELS_CONFIG={path!r} cannot be read: {e}") from None
    cached = _toml_cache.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    data = tomllib.loads(p.read_text())
    unknown = set(data) - {"backend", "objective", "allow_unverified"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; expected backend, "
                         "objective, allow_unverified")
    layer = _Layer(_parse_mapping(data.get("backend", {})), data.get("objective"),
                   data.get("allow_unverified"), f"config file {path}")
    _check_objective(layer.objective)
    _toml_cache[path] = (mtime, layer)
    return layer


def _lookup(layer: _Layer, family: str, op: str) -> tuple[str, bool] | None:
    d = dict(layer.backends)
    for key, strict in ((f"{family}.{op}", True), (family, False), ("*", False)):
        if key in d:
            return d[key], strict
    return None


def resolve(family: str, op: str, backend: str | None, objective: str | None,
            allow_unverified: bool | None) -> Resolved:
    """Merge every override source for one call (strongest first). A hard override (the
    `backend=` argument, a `use_backend` name, TSKERNELS_BACKEND, the TOML file) in any layer
    beats a `KernelPolicy`'s soft preferences, wherever the policy was entered: an engine's
    policy never hides a user's explicit choice around it."""
    stack = _stack.get()
    layers = (*reversed(stack), *_global_layers()) if stack else _global_layers()
    chosen, source, strict = backend, "backend= argument", True
    obj, allow = objective, allow_unverified
    prefer: tuple[str, ...] = ()
    prefer_source = ""
    for layer in layers:
        if layer.policy is not None:
            if not prefer:
                prefer = layer.policy.lookup(family, op)
                prefer_source = layer.source
        elif chosen is None:
            hit = _lookup(layer, family, op)
            if hit is not None:
                chosen, strict = hit
                source = layer.source
        obj = obj if obj is not None else layer.objective
        allow = allow if allow is not None else layer.allow_unverified
    _check_objective(obj)
    if chosen is not None:
        prefer = ()
    else:
        source = prefer_source if prefer else ""
    return Resolved(chosen, source, strict, obj or "default", bool(allow), prefer)


def active_policy() -> KernelPolicy | None:
    """The innermost `KernelPolicy` entered with `use_backend(policy)` in this context."""
    for layer in reversed(_stack.get()):
        if layer.policy is not None:
            return layer.policy
    return None
