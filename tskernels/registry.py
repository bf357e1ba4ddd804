"""Kernel registry: register backends with what they need and promise, select one per call.

A kernel is a `KernelSpec`. `select(family, op, device=..., formats=..., traits=...)` filters the
registered kernels by platform capability, tensor formats, problem traits, objective and
verification status, ranks the survivors, and caches the decision. `explain(...)` says why each
candidate won or lost. Overrides (strongest first): the per-call `backend=` argument, the
`use_backend(...)` context manager, the TSKERNELS_BACKEND environment variable, and the TOML
file named by TSKERNELS_CONFIG (see `tskernels.config`).

Verification is explicit: a kernel is *run-verified* on the targets whose GPU tier passed (kept in
`verified.json`, cross-checked against benchmarks/results by a test) and *compile-verified* for
the targets the compile matrix builds in CI. Auto-selection on a GPU only considers kernels
run-verified for that target, unless unverified kernels are explicitly allowed.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from . import config
from .platform import Platform, platform_of

BANDS = ("reference", "portable", "performant", "specialized", "plugin")
OBJECTIVES = ("default", "latency", "throughput", "deterministic", "portable")
ALL_TARGETS = ("sm_90", "sm_100", "sm_120", "gfx942", "gfx950")

_DTYPE_FORMATS = {
    torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2",
    torch.int64: "int64", torch.int32: "int32", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}


def fmt(dtype: torch.dtype) -> str:
    """The registry's name for a tensor dtype ("bf16", "fp8_e4m3", ...)."""
    return _DTYPE_FORMATS.get(dtype, str(dtype).removeprefix("torch."))


class SelectionError(RuntimeError):
    """No kernel can run the problem, or an override names one that cannot."""


@dataclass(frozen=True)
class Capability:
    """What a kernel needs from the platform.

    vendors: platforms it runs on ("cpu", "nvidia", "amd"). min_sm/max_sm: inclusive NVIDIA SM
    range. gfx: allowed AMD archs (None = any). features: required hardware features (see
    `platform`). interpretable: runs on CPU tensors under TRITON_INTERPRET=1 (tests only).
    modules: Python packages it needs at run time (checked without importing them).
    """

    vendors: frozenset[str] = frozenset({"cpu", "nvidia", "amd"})
    min_sm: int | None = None
    max_sm: int | None = None
    gfx: frozenset[str] | None = None
    features: frozenset[str] = frozenset()
    interpretable: bool = False
    # Python packages the backend needs at run time (e.g. CuPy to compile and launch CUDA
    # sources): without them it is not selectable, rather than failing when called
    modules: frozenset[str] = frozenset()
    # Alternatives, at least one of which the platform must have in full (a CPU kernel with an
    # AVX-512, an AVX2+FMA and a NEON path: ({"avx512f"}, {"avx2", "fma"}, {"neon"})); () = none
    any_features: tuple[frozenset[str], ...] = ()

    def mismatch(self, p: Platform) -> str | None:
        """Why this capability does not fit platform `p`, or None when it does."""
        if p.vendor == "cpu" and p.interpreter and self.interpretable:
            return None
        if p.vendor not in self.vendors:
            return f"vendor {p.vendor!r} not in {sorted(self.vendors)}"
        if p.vendor == "nvidia":
            if self.min_sm is not None and p.arch < self.min_sm:
                return f"needs sm_{self.min_sm}+, device is {p.target}"
            if self.max_sm is not None and p.arch > self.max_sm:
                return f"supports up to sm_{self.max_sm}, device is {p.target}"
        if p.vendor == "amd" and self.gfx is not None and p.arch not in self.gfx:
            return f"arch {p.arch} not in {sorted(self.gfx)}"
        missing = self.features - p.features
        if missing:
            return f"missing features {sorted(missing)} (has {sorted(p.features) or 'none'})"
        if self.any_features and not any(alt <= p.features for alt in self.any_features):
            alts = " or ".join("+".join(sorted(a)) for a in self.any_features)
            return f"needs {alts} (has {sorted(p.features) or 'none'})"
        absent = sorted(m for m in self.modules if not _module_available(m))
        if absent:
            return f"needs the Python package(s) {absent}, not installed"
        return None


def _module_available(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


ANY_DEVICE = Capability()
TRITON_GPU = Capability(vendors=frozenset({"nvidia", "amd"}), min_sm=80, interpretable=True)


@dataclass(frozen=True)
class Verification:
    """run: targets whose GPU tier passed ("cpu" for references). compiled: targets the compile
    matrix builds in CI. interpreter: property-tested on CPU under TRITON_INTERPRET=1."""

    run: frozenset[str] = frozenset()
    compiled: frozenset[str] = frozenset()
    interpreter: bool = False

    def status(self, target: str) -> str:
        if target in self.run:
            return "run-verified"
        if target in self.compiled:
            return "compile-verified"
        return "unverified"


@dataclass(frozen=True)
class KernelSpec:
    family: str
    op: str
    backend: str
    fn: Callable[..., Any]
    capability: Capability = ANY_DEVICE
    formats: Mapping[str, frozenset[str]] = field(default_factory=dict)
    traits: Mapping[str, Any] = field(default_factory=dict)
    band: str = "portable"
    priority: int = 0
    tags: frozenset[str] = frozenset()
    verification: Verification = Verification()
    compile_cases: Callable[[], list] | None = None
    description: str = ""
    opt_in: bool = False  # never auto-selected: runs only when named (backend=, use_backend)
    # problem traits the kernel is auto-selected for (where it was measured ahead of the
    # alternatives); a named request runs it on any problem its `traits` accept
    prefer: Mapping[str, Any] = field(default_factory=dict)
    # planned ops: the factory `plan(...) -> Plan` (see tskernels.plan); the public `*_plan`
    # functions call it, and `fn` is the one-shot path built from it unless given
    plan: Callable[..., Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.family}.{self.op}.{self.backend}"

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_lock = threading.RLock()
_kernels: dict[tuple[str, str], list[KernelSpec]] = {}
_cache: dict[tuple, KernelSpec] = {}
_VERIFIED_FILE = Path(__file__).with_name("verified.json")


def _recorded_run_targets() -> dict[str, frozenset[str]]:
    """Run-verified targets recorded from GPU-tier runs (see verified.json)."""
    try:
        data = json.loads(_VERIFIED_FILE.read_text())
    except FileNotFoundError:
        return {}
    return {name: frozenset(rec.get("run", {})) for name, rec in data.get("kernels", {}).items()}


_RUN_RECORDS = _recorded_run_targets()


def register(family: str, op: str, *, backend: str, capability: Capability = ANY_DEVICE,
             formats: Mapping[str, Collection[str]] | None = None,
             traits: Mapping[str, Any] | None = None, band: str = "portable", priority: int = 0,
             tags: Collection[str] = (), compiled: Collection[str] = (),
             interpreter: bool = False, run_verified: Collection[str] = (),
             compile_cases: Callable[[], list] | None = None, description: str = "",
             opt_in: bool = False, prefer: Mapping[str, Any] | None = None,
             plan: Callable[..., Any] | None = None):
    """Decorator registering `fn` as the `backend` implementation of `family.op`.

    plan: for planned ops (tskernels.plan), the backend's plan factory. Then the call
    `register(..., plan=Factory)` registers the kernel at once, its one-shot function built by
    the registry (`tskernels.plan.ONE_SHOT`); decorating a function as well replaces that
    one-shot function with it (the reference does: it calls its ground truth directly).

    compiled: targets the compile matrix must build it for (checked in CI). run_verified: targets
    it is run-verified on besides those recorded in verified.json (references pass "cpu").
    opt_in: the kernel is never auto-selected, only run when named (a narrower or differently
    rounded variant an engine chooses deliberately). prefer: trait predicates that must also
    hold for auto-selection (the problems it was measured faster on); a named request only
    checks `traits`.
    """
    if band not in BANDS:
        raise ValueError(f"band must be one of {BANDS}, got {band!r}")

    def deco(fn):
        name = f"{family}.{op}.{backend}"
        spec = KernelSpec(
            family, op, backend, fn, capability,
            {role: frozenset(v) for role, v in (formats or {}).items()}, dict(traits or {}),
            band, priority, frozenset(tags),
            Verification(frozenset(run_verified) | _RUN_RECORDS.get(name, frozenset()),
                         frozenset(compiled), interpreter),
            compile_cases, description or (fn.__doc__ or "").strip().split("\n")[0], opt_in,
            dict(prefer or {}), plan)
        add(spec)
        return fn

    if plan is not None:
        from .plan import ONE_SHOT, one_shot
        if (family, op) in ONE_SHOT:
            deco(one_shot(family, op, plan))
    return deco


def planned(spec: KernelSpec) -> Callable[..., Any]:
    """The plan factory of a planned kernel (raises naming the kernel when it has none)."""
    if spec.plan is None:
        raise SelectionError(f"{spec.name}: registered without plan=, so it cannot build a "
                             "plan (use the one-shot op, or name a planned backend)")
    return spec.plan


def add(spec: KernelSpec) -> None:
    """Register a ready KernelSpec (plugins may call this directly). Replaces a spec of the same
    family/op/backend."""
    with _lock:
        lst = _kernels.setdefault((spec.family, spec.op), [])
        lst[:] = [k for k in lst if k.backend != spec.backend] + [spec]
        _cache.clear()


def kernels(family: str | None = None, op: str | None = None) -> list[KernelSpec]:
    """All registered kernels, optionally of one family / op."""
    _ensure_loaded()
    return [k for (f, o), lst in sorted(_kernels.items()) for k in lst
            if (family is None or f == family) and (op is None or o == op)]


def _trait_ok(allowed: Any, value: Any) -> bool:
    if callable(allowed):
        return bool(allowed(value))
    return value in allowed


def _filter_reason(k: KernelSpec, p: Platform, formats: Mapping[str, str],
                   traits: Mapping[str, Any], objective: str, named: bool = False) -> str | None:
    if k.opt_in and not named:
        return "opt-in backend: runs only when named (backend=, use_backend)"
    why = k.capability.mismatch(p)
    if why:
        return why
    for role, f in formats.items():
        if role in k.formats and f not in k.formats[role]:
            return f"format {role}={f} not in {sorted(k.formats[role])}"
    for name, value in traits.items():
        if value is not None and name in k.traits and not _trait_ok(k.traits[name], value):
            return f"trait {name}={value!r} unsupported"
        if not named and value is not None and name in k.prefer and \
                not _trait_ok(k.prefer[name], value):
            return f"trait {name}={value!r} outside the problems it is preferred for"
    if objective == "deterministic" and "deterministic" not in k.tags:
        return "objective 'deterministic': kernel is not tagged deterministic"
    if objective == "portable" and k.band != "reference" and \
            not {"nvidia", "amd"} <= k.capability.vendors:
        return "objective 'portable': kernel is vendor-specific"
    return None


def _verification_reason(k: KernelSpec, p: Platform) -> str | None:
    if k.band == "reference":
        return None  # plain PyTorch: the ground truth wherever torch runs
    if p.vendor == "cpu" and p.interpreter and k.capability.interpretable and \
            "cpu" not in k.capability.vendors:
        return "Triton interpreter: only selected when named explicitly"
    status = k.verification.status(p.target)
    if status != "run-verified":
        return f"{status} on {p.target}, not run-verified (allow_unverified=True to use)"
    return None


def _rank_key(k: KernelSpec, objective: str):
    tag_first = {"latency": "latency", "throughput": "throughput"}.get(objective)
    return (0 if tag_first and tag_first in k.tags else 1, -BANDS.index(k.band), -k.priority)


def _candidates(family: str, op: str) -> list[KernelSpec]:
    _ensure_loaded()
    cands = _kernels.get((family, op))
    if not cands:
        known = sorted(f"{f}.{o}" for f, o in _kernels)
        raise SelectionError(f"no kernels registered for {family}.{op}; known ops: {known}")
    return cands


def select(family: str, op: str, *, device: torch.device | str | None = None,
           formats: Mapping[str, str] | None = None, traits: Mapping[str, Any] | None = None,
           objective: str | None = None, backend: str | None = None,
           allow_unverified: bool | None = None) -> KernelSpec:
    """Pick the kernel that runs `family.op` for this problem.

    device: where the tensors live. formats: {tensor role: format} (see `fmt`). traits: discrete
    problem facts ({"head_dim": 128, "page_size": 16}). objective: one of OBJECTIVES. backend:
    a per-call override. Raises SelectionError when nothing can run, naming every reason.
    """
    ov = config.resolve(family, op, backend, objective, allow_unverified)
    formats = formats or {}
    traits = traits or {}
    p = platform_of(device)
    key = (family, op, p, tuple(sorted(formats.items())), tuple(sorted(traits.items())), ov)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    with _lock:
        chosen, _ = _decide(family, op, p, formats, traits, ov)
        _cache[key] = chosen
    return chosen


def _decide(family, op, p, formats, traits, ov):
    cands = _candidates(family, op)
    report: list[tuple[KernelSpec, str]] = []
    if ov.backend is not None:
        named = [k for k in cands if k.backend == ov.backend]
        if not named:
            if ov.strict:
                raise SelectionError(
                    f"{family}.{op}: no backend {ov.backend!r} (from {ov.source}); "
                    f"registered: {sorted(k.backend for k in cands)}")
        else:
            k = named[0]
            why = _filter_reason(k, p, formats, traits, "default", named=True)
            if why:
                raise SelectionError(f"{family}.{op}: backend {ov.backend!r} requested by "
                                     f"{ov.source} cannot run here: {why}")
            return k, [(k, f"selected: requested by {ov.source}")]
    report += _preferred(cands, p, formats, traits, ov)
    if report and report[-1][1].startswith("selected"):
        return report[-1][0], report
    ok = []
    for k in cands:
        why = _filter_reason(k, p, formats, traits, ov.objective)
        if why is None and not ov.allow_unverified:
            why = _verification_reason(k, p)
        if why:
            report.append((k, f"filtered: {why}"))
        else:
            ok.append(k)
    if not ok:
        reasons = "; ".join(f"{k.backend}: {r}" for k, r in report)
        raise SelectionError(f"no kernel for {family}.{op} on {p.target} with formats "
                             f"{dict(formats)} traits {dict(traits)}: {reasons}")
    ok.sort(key=lambda k: _rank_key(k, ov.objective))
    report += [(ok[0], f"selected (objective {ov.objective}, band {ok[0].band}, "
                       f"priority {ok[0].priority})")]
    report += [(k, f"lost: ranked #{i + 2} (band {k.band}, priority {k.priority})")
               for i, k in enumerate(ok[1:])]
    return ok[0], report


def _preferred(cands, p, formats, traits, ov) -> list[tuple[KernelSpec, str]]:
    """A KernelPolicy's soft preferences, in order: the first that can run the problem is
    selected (last report row); the others say why they were passed over."""
    report = []
    for name in ov.prefer:
        k = next((c for c in cands if c.backend == name), None)
        if k is None:
            continue
        why = _filter_reason(k, p, formats, traits, "default", named=True)
        if why is None:
            return report + [(k, f"selected: preferred by {ov.source}")]
        report.append((k, f"passed over by {ov.source}: {why}"))
    return report


def explain(family: str, op: str, *, device=None, formats=None, traits=None, objective=None,
            backend=None, allow_unverified=None, file=None) -> str:
    """Print (to `file`, default stdout; pass file=False to stay silent) and return a table of
    every candidate for `family.op` and why it won, lost or was filtered."""
    ov = config.resolve(family, op, backend, objective, allow_unverified)
    p = platform_of(device)
    lines = [f"{family}.{op} on {p.target} ({p.name}); formats={dict(formats or {})} "
             f"traits={dict(traits or {})} objective={ov.objective}"
             + (f" override={ov.backend!r} from {ov.source}" if ov.backend else "")]
    if p.vendor == "cpu":
        lines.append(f"  cpu features: {' '.join(sorted(p.features)) or 'none detected'}")
    try:
        _, report = _decide(family, op, p, formats or {}, traits or {}, ov)
    except SelectionError as e:
        report = [(None, f"error: {e}")]
    for k, why in report:
        if k is None:
            lines.append(f"  {why}")
            continue
        lines.append(f"  {k.backend:<12} {k.band:<11} {k.verification.status(p.target):<17} {why}")
    text = "\n".join(lines)
    if file is not False:
        print(text, file=file)
    return text


def clear_cache() -> None:
    with _lock:
        _cache.clear()


_loaded = False


def _ensure_loaded() -> None:
    """Import every built-in family once (registering its backends), then plugins."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        _loaded = True
        from . import ops  # noqa: F401  (registers built-in kernels)
        from . import plugins
        plugins.load_all()


def with_verification(spec: KernelSpec, **changes) -> KernelSpec:
    """A copy of `spec` with its Verification fields replaced (tests, plugins)."""
    return replace(spec, verification=replace(spec.verification, **changes))


def verification_table(builtin_only: bool = True) -> str:
    """Markdown table: op x backend x how it is verified (README embeds it; a test keeps the
    copy current). builtin_only: leave out kernels registered by plugins or other packages."""
    rows = ["| op | backend | band | run-verified on | interpreter (CPU) | compile-verified for |",
            "|---|---|---|---|---|---|"]
    # sorted by backend within an op: the table does not depend on the order files import in
    for k in sorted(kernels(), key=lambda k: (k.family, k.op, k.backend)):
        if builtin_only and not getattr(k.fn, "__module__", "").startswith("tskernels."):
            continue
        run = ", ".join(sorted(k.verification.run)) or "—"
        if k.band == "reference":
            run = "any torch device (ground truth)"
        band = f"{k.band} (opt-in)" if k.opt_in else k.band
        rows.append(f"| {k.family}.{k.op} | {k.backend} | {band} | {run} | "
                    f"{'yes' if k.verification.interpreter else '—'} | "
                    f"{', '.join(sorted(k.verification.compiled)) or '—'} |")
    return "\n".join(rows)
