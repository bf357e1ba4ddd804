"""Config lookup with a documented fallback chain; never searches on the serving path.

For kernel K, problem P on device D (bucket B = K's key of P), the first link that has a
current (not stale) entry supplies the config:

1. ``exact``: D's tables (user, then shipped) hold K at bucket B;
2. ``nearest-bucket``: D's tables hold K at a bucket with the same string dimensions
   (dtypes, layouts) whose integer dimensions are closest on a log2 scale, at most
   K's `max_distance` (default 3: within 8x summed over the dimensions) away, and not an
   entry that only confirms its own bucket's heuristic where P's heuristic differs;
3. ``family:<device>``: a device of D's architecture family (an H200 uses H100 entries,
   an MI325X MI300X entries), exact bucket first, then nearest;
4. ``heuristic``: K's own heuristic.

Stale entries (kernel source or Triton / CUDA / ROCm version changed) are skipped with one
warning per table and kernel that names the table and the command that re-tunes it.
"""
from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import capture
from .declare import KernelSpace, bucket_str, parse_bucket
from .table import Entry, Table, Tables, device_family


class StaleTableWarning(UserWarning):
    """A tuning table entry was skipped because it no longer matches the kernel or libraries."""


@dataclass
class Choice:
    config: dict
    link: str                         # exact | nearest-bucket | family:<device> | heuristic
    kernel: str
    bucket: str
    device: str
    entry: Entry | None = None
    table: str | None = None
    skipped: list[str] = field(default_factory=list)   # stale entries passed over

    def explain(self) -> str:
        src = f"{self.table} [{self.entry.bucket}]" if self.entry else "the kernel's heuristic"
        lines = [f"{self.kernel} on {self.device}, bucket {self.bucket}: {self.link} -> {self.config}"
                 f" (from {src})"]
        lines += [f"  skipped stale: {s}" for s in self.skipped]
        return "\n".join(lines)


def _distance(a: Mapping, b: Mapping, exact: tuple[str, ...] = ()) -> float | None:
    """log2 distance over integer dims; None when the buckets are not comparable (different
    dims, a string dim or an `exact` dim that differs)."""
    if set(a) != set(b):
        return None
    d = 0.0
    for k, va in a.items():
        vb = b[k]
        if k in exact:
            if va != vb:
                return None
        elif isinstance(va, int) and isinstance(vb, int):
            d += abs(math.log2(max(va, 1)) - math.log2(max(vb, 1)))
        elif va != vb:
            return None
    return d


class Lookup:
    def __init__(self, tables: Tables | None = None):
        self.tables = tables or Tables()
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._memo: dict[tuple, Choice] = {}

    def invalidate(self) -> None:
        """Forget loaded tables and memoised choices (after tables changed on disk)."""
        self.tables.invalidate()
        with self._lock:
            self._memo.clear()

    def _fresh(self, table: Table, ks: KernelSpace, src: str | None, skipped: list[str]):
        out = []
        for e in table.for_kernel(ks.kernel):
            why = e.stale_reason(src)
            if why is None:
                out.append(e)
                continue
            skipped.append(f"{table.path} [{e.bucket}]: {why}")
            with self._lock:
                first = (str(table.path), ks.kernel) not in self._warned
                self._warned.add((str(table.path), ks.kernel))
            if first:
                warnings.warn(
                    f"autotune: {table.path} has stale entries for {ks.kernel} ({why}); they are "
                    f"not used. Re-tune with `python -m autotune tune {ks.kernel.rsplit('.', 1)[0]}`"
                    f" or drop them with `python -m autotune prune`.", StaleTableWarning,
                    stacklevel=4)
        return out

    def _best(self, ks: KernelSpace, entries: list[Entry], dims: Mapping, problem: Mapping,
              target, skipped: list[str]) -> tuple[Entry | None, bool]:
        """The exact entry, else the nearest comparable one; entries whose config the space
        prunes for this problem on `target` (too much shared memory, ...) are passed over."""
        def fits(e: Entry) -> bool:
            # {} ("the kernel's own choice", a heuristic outside the space that won) always
            # fits; a config the pruner cannot read (other knobs) does not
            if not e.config or not (ks.prune and target):
                return True
            try:
                why = ks.prune(e.config, problem, target)
            except (KeyError, TypeError) as exc:
                why = f"not a config of this space ({type(exc).__name__}: {exc})"
            if why:
                skipped.append(f"[{e.bucket}] {e.config}: does not fit this problem ({why})")
            return why is None
        def informs(e: Entry) -> bool:
            # An entry equal to its own bucket's heuristic config says only "the heuristic won
            # there". Where this problem's heuristic is another config (another row of the
            # kernel's own table) that is no evidence for the entry's config here, so the chain
            # goes on (session 23: the H200's T = 1024 MoE entry, the 1024-row heuristic,
            # handed 64-row tiles to T = 8192, whose 128-row heuristic is 15 % faster).
            # A heuristic that cannot read the bucket's values (dims named unlike the
            # problem's keys) keeps the entry.
            try:
                at_e = ks.heuristic_for({**problem, **parse_bucket(e.bucket)}, target)
                if "here" not in mine:      # this problem's heuristic, once per lookup
                    mine["here"] = ks.heuristic_for(problem, target)
            except (KeyError, TypeError, ValueError):
                return True
            if e.config == at_e and at_e != mine["here"]:
                skipped.append(f"[{e.bucket}] {e.config}: that bucket's heuristic, not this "
                               f"problem's ({mine['here']})")
                return False
            return True
        mine: dict = {}
        want = bucket_str(dims)
        for e in entries:
            if e.bucket == want and fits(e):
                return e, True
        scored = sorted((d, e.bucket, i) for i, e in enumerate(entries)
                        if (d := _distance(dims, parse_bucket(e.bucket), ks.exact)) is not None
                        and d <= ks.max_distance)
        for _, _, i in scored:
            if fits(entries[i]) and informs(entries[i]):
                return entries[i], False
        return None, False

    def choose(self, ks: KernelSpace, problem: Mapping, device: str, *,
               record: bool = True, target=None) -> Choice:
        """target: the `Target` whose budgets a tuned config must fit (None: not checked)."""
        dims = ks.bucket(problem)
        want = bucket_str(dims)
        if record:
            capture.record(ks.kernel, want, device)
        src = ks.source_hash()
        memo_key = (ks.kernel, device, want, src, target)
        hit = self._memo.get(memo_key)
        if hit is not None:
            return hit
        choice = self._choose(ks, problem, device, dims, want, src, target)
        with self._lock:
            self._memo[memo_key] = choice
        return choice

    def _choose(self, ks, problem, device, dims, want, src, target) -> Choice:
        skipped: list[str] = []
        for t in self.tables.layers(device):
            e, exact = self._best(ks, self._fresh(t, ks, src, skipped), dims, problem, target,
                                  skipped)
            if e is not None and exact:
                return Choice(dict(e.config), "exact", ks.kernel, want, device, e, str(t.path), skipped)
        for t in self.tables.layers(device):
            e, _ = self._best(ks, self._fresh(t, ks, src, skipped), dims, problem, target,
                              skipped)
            if e is not None:
                return Choice(dict(e.config), "nearest-bucket", ks.kernel, want, device, e,
                              str(t.path), skipped)
        fam = device_family(device)
        if fam is not None:
            others = [d for d in self.tables.devices() if d != device and device_family(d) == fam]
            for exact_only in (True, False):
                for other in others:
                    for t in self.tables.layers(other):
                        e, exact = self._best(ks, self._fresh(t, ks, src, skipped), dims,
                                              problem, target, skipped)
                        if e is not None and (exact or not exact_only):
                            return Choice(dict(e.config), f"family:{other}", ks.kernel, want,
                                          device, e, str(t.path), skipped)
        return Choice(ks.heuristic_for(problem, target), "heuristic", ks.kernel, want, device,
                      skipped=skipped)


_default: Lookup | None = None


def default_lookup() -> Lookup:
    global _default
    if _default is None:
        _default = Lookup()
    return _default


def choose(ks: KernelSpace, problem: Mapping, device: str, target=None) -> Choice:
    """The config for `problem` by the fallback chain (module docstring), from the default
    tables (user cache over shipped); with `target`, only configs that fit its budgets."""
    return default_lookup().choose(ks, problem, device, target=target)
