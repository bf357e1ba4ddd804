"""Declared tuning spaces: what a kernel may be tuned over, and how a problem maps to a bucket.

A kernel module declares its space once, next to the kernel:

    declare(KernelSpace(
        kernel="norm.rmsnorm.triton",
        space=Space(num_warps=[4, 8, 16], rows=[1, 2, 4]),
        key=lambda p: {"N": pow2_bucket(p["N"]), "dtype": p["dtype"]},
        heuristic=lambda p: {"num_warps": 8, "rows": 1},
        prune=lambda cfg, p, target: None if cfg["rows"] * p["N"] <= 65536 else "too wide",
        source=lambda: _rmsnorm_kernel.cache_key))

`key` returns the bucket's dimensions: integers are compared on a log scale when looking for
the nearest tuned bucket; strings (dtypes, layouts) must match exactly. `prune` names why a
config cannot run on a target (shared-memory / LDS budget, divisibility) so it is never
compiled. `source` returns the text whose hash versions the table entries (a Triton function's
`cache_key`, which covers the functions it calls, or a CUDA file plus its build options).
`space` may be a function of the target's vendor ("nvidia", "amd"). Arch-specific backend
knobs (AMD CDNA: `waves_per_eu`, `matrix_instr_nonkdim`, `kpack`) are declared with
`arch_knobs`, keyed by vendor or arch, and their heuristic values with `arch_defaults`:

    arch_knobs={"amd": {"waves_per_eu": [0, 1, 2], "matrix_instr_nonkdim": [16, 32]},
                "gfx950": {"kpack": [1, 2]}},      # an arch's entry adds to / overrides its vendor's
    arch_defaults={"amd": {"waves_per_eu": 2, "matrix_instr_nonkdim": 16}},

The tuner then searches those knobs only on that vendor / arch, the heuristic link returns the
kernel's heuristic plus the defaults of the target, and `backend_options(cfg)` picks the knobs
out of a config for the launch (`kernel[grid](..., **backend_options(cfg))`).
"""
from __future__ import annotations

import hashlib
import inspect
import re
import textwrap
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .space import Space

Bucket = Mapping[str, "int | str"]

# Launch options Triton passes to its AMD backend (not constexprs of the kernel).
BACKEND_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def backend_options(cfg: Mapping) -> dict:
    """The backend knobs of a config, as launch keyword arguments ({} on NVIDIA configs)."""
    return {k: cfg[k] for k in BACKEND_KNOBS if k in cfg}


@dataclass(frozen=True)
class Target:
    """What a config is pruned against: vendor, arch ("sm_90", "gfx942") and its budgets."""
    vendor: str = "nvidia"
    arch: str = "sm_90"
    smem_bytes: int = 227 * 1024          # per-block opt-in shared memory (H100/H200: 227 KB)
    warp_size: int = 32

    @staticmethod
    def for_arch(arch: str) -> "Target":
        """Budgets of the architectures the compile matrix targets."""
        if arch.startswith("gfx"):
            lds = 160 * 1024 if arch == "gfx950" else 64 * 1024      # MI355X / MI300X-MI325X
            return Target("amd", arch, lds, 64)
        sm = int(arch.removeprefix("sm_"))
        smem = {80: 163, 86: 99, 89: 99, 90: 227, 100: 227, 120: 99}.get(sm, 99) * 1024
        return Target("nvidia", arch, smem, 32)


@dataclass(frozen=True)
class KernelSpace:
    kernel: str
    space: Space | Callable[[str], Space]
    key: Callable[[Mapping], dict]
    heuristic: Callable[[Mapping], dict]
    prune: Callable[[dict, Mapping, Target], str | None] | None = None
    source: Callable[[], str] | None = None
    # For the tuner (not needed for lookups): runner(problem, device) -> Runner, and a parser
    # of `--shapes` text ("B=64,L=4096") into a problem.
    runner: Callable[[Mapping, str], "Runner"] | None = None
    parse: Callable[[str], dict] | None = None
    # A typical problem (tests check its heuristic config is valid and its runner works).
    example: Mapping | None = None
    # Integer bucket dimensions that must match exactly (a head dim, a group size): a tuned
    # entry for another value is never "nearest".
    exact: tuple[str, ...] = ()
    # Extra knobs per vendor or arch ("amd", "gfx942"): {key: {knob: [choices]}}; an arch's
    # entry is applied after its vendor's. `arch_defaults`: the heuristic's values of them.
    arch_knobs: Mapping[str, Mapping[str, Sequence]] = field(default_factory=dict)
    arch_defaults: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # The problems `tskernels-bench --tune` tunes when given no shapes (the bench shapes).
    shapes: tuple[Mapping, ...] = ()
    # How far (summed log2 over the integer dims) a "nearest" entry may be: farther ones are
    # not used (a sparse table must not hand a 4096-row tile to a 16-row problem), and the
    # chain goes on to the device family, then the heuristic.
    max_distance: float = 3.0

    def __post_init__(self):
        if not self.kernel or self.kernel.count(".") < 2:
            raise ValueError(f"kernel: expected 'family.op.backend', got {self.kernel!r}")
        for key, knobs in {**self.arch_knobs, **self.arch_defaults}.items():
            bad = [k for k in knobs if k not in BACKEND_KNOBS]
            if bad:
                raise ValueError(f"{self.kernel}: arch knobs of {key!r} must be among "
                                 f"{BACKEND_KNOBS}, got {bad}")

    def _arch_layers(self, table: Mapping, vendor: str, arch: str | None) -> dict:
        out: dict = {}
        for key in (vendor, arch):
            if key and key in table:
                out.update(table[key])
        return out

    def space_for(self, vendor: str = "nvidia", arch: str | None = None) -> Space:
        """The space on a vendor / arch: the declared one plus that target's arch knobs."""
        base = self.space(vendor) if callable(self.space) and not isinstance(self.space, Space) \
            else self.space
        extra = self._arch_layers(self.arch_knobs, vendor, arch)
        if not extra:
            return base
        return Space(base.where, **{**base.choices, **{k: list(v) for k, v in extra.items()}})

    def heuristic_for(self, problem: Mapping, target: "Target | None" = None) -> dict:
        """The heuristic config on `target`: the kernel's heuristic plus the target's arch
        defaults ({} stays {}: the kernel's plan decides everything)."""
        cfg = dict(self.heuristic(problem))
        if cfg and target is not None:
            cfg.update(self._arch_layers(self.arch_defaults, target.vendor, target.arch))
        return cfg

    def bucket(self, problem: Mapping) -> dict:
        dims = dict(self.key(problem))
        for k, v in dims.items():
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise TypeError(f"{self.kernel}: bucket dimension {k!r} must be int or str, got {v!r}")
        return dims

    def candidates(self, problem: Mapping, target: Target) -> tuple[list[dict], list[dict]]:
        """(configs that may run on target, [{"config", "reason"}] of those pruned)."""
        keep, pruned = [], []
        for cfg in self.space_for(target.vendor, target.arch):
            why = self.prune(cfg, problem, target) if self.prune else None
            (pruned.append({"config": cfg, "reason": why}) if why else keep.append(cfg))
        return keep, pruned

    def source_hash(self) -> str | None:
        if self.source is None:
            return None
        return _text_hash(str(self.source()))


class Runner:
    """Inputs of one problem, built once; `build(cfg)` returns the zero-argument launch to time
    (rotating input copies larger than L2 where the kernel is memory-bound), `check(cfg)` runs
    it once and compares with the reference (a config that computes wrong results never wins)."""

    def build(self, config: dict) -> Callable[[], object]:  # pragma: no cover - protocol
        raise NotImplementedError

    def check(self, config: dict) -> bool:  # pragma: no cover - protocol
        raise NotImplementedError


def bucket_str(dims: Mapping) -> str:
    """Canonical text of a bucket: 'L=8192,d=128,kv=bf16' (sorted names)."""
    return ",".join(f"{k}={dims[k]}" for k in sorted(dims))


def parse_bucket(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def _normalized(src: str) -> str:
    """Source without comments, docstring-free blank lines or trailing spaces: what the hash of
    a kernel covers (a moved line or a reworded comment does not orphan its tuned entries)."""
    out = []
    for line in src.splitlines():
        code = line.split("#", 1)[0].rstrip()
        if code.strip():
            out.append(code)
    return "\n".join(out)


def _src_and_globals(fn) -> tuple[str | None, dict]:
    """(source, globals) of a Triton JITFunction, or of an interpreter-wrapped one (whose
    plain Python function is `fn.fn`)."""
    src = getattr(fn, "src", None)
    if src is not None:
        return src, getattr(fn, "__globals__", {}) or {}
    inner = getattr(fn, "fn", None)
    if inner is not None and hasattr(inner, "__code__"):
        try:
            text = inspect.getsource(inner)
        except (OSError, TypeError):
            return None, {}
        # drop the decorator lines: the JIT's `src` starts at the def
        match = re.search(r"^\s*def\s", text, re.M)
        return textwrap.dedent(text[match.start():] if match else text), inner.__globals__
    return None, {}


_HASHES: dict[str, str] = {}
_JIT_MEMO: dict[int, tuple[str, str]] = {}


def _text_hash(text: str) -> str:
    """sha256 prefix of `text`, memoised (lookups hash a kernel's source on every launch)."""
    h = _HASHES.get(text)
    if h is None:
        h = _HASHES[text] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return h


def jit_source(fn, _depth: int = 3, _seen: set | None = None) -> str:
    """The normalized source of a `@triton.jit` function and of the jit functions it calls
    (memoised per function while its source text object is unchanged)."""
    src = getattr(fn, "src", None)
    if _seen is None and isinstance(src, str):
        hit = _JIT_MEMO.get(id(fn))
        if hit is not None and hit[0] is src:
            return hit[1]
        out = _jit_source(fn, _depth, None)
        _JIT_MEMO[id(fn)] = (src, out)
        return out
    return _jit_source(fn, _depth, _seen)


def _jit_source(fn, _depth: int = 3, _seen: set | None = None) -> str:
    """The normalized source of a `@triton.jit` function and of the jit functions it calls
    (by name, through its globals, `_depth` levels deep); the same text whether Triton compiles
    or interprets (TRITON_INTERPRET=1). Duck-typed: this package does not import triton."""
    seen = _seen if _seen is not None else set()
    src, glb = _src_and_globals(fn)
    if src is None or id(fn) in seen:
        return ""
    seen.add(id(fn))
    parts = [_normalized(src)]
    if _depth > 0:
        for name in sorted(set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", src))):
            dep = glb.get(name)
            if dep is not None and dep is not fn and _src_and_globals(dep)[0] is not None \
                    and not isinstance(dep, type) and not callable(getattr(dep, "__code__", None)):
                parts.append(_jit_source(dep, _depth - 1, seen))
    return "\n".join(p for p in parts if p)


_SPACES: dict[str, KernelSpace] = {}
_LOCK = threading.Lock()


def declare(ks: KernelSpace) -> KernelSpace:
    """Register a kernel's space (idempotent for the same object; a different one replaces)."""
    with _LOCK:
        _SPACES[ks.kernel] = ks
    return ks


def spaces() -> dict[str, KernelSpace]:
    """Every declared space, by kernel name (import the kernel modules first)."""
    return dict(_SPACES)


def get_space(kernel: str) -> KernelSpace:
    try:
        return _SPACES[kernel]
    except KeyError:
        raise KeyError(f"no tuning space declared for {kernel!r}; declared: "
                       f"{sorted(_SPACES) or 'none'}") from None
