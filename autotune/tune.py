"""The tuner: time every valid config of a bucket, check it, pick deterministically, persist.

Per bucket: the space's candidates for the target (pruned ones are never compiled), each built,
checked against the reference, then timed `repeats` times (each a median from the timer).
Configs that fail to build or run are skipped and reported. The fastest median wins, but every
candidate within noise of it — max(tie_rel x best, the best's spread of repeats, capped at
spread_cap x best) — is a *tie*; among ties the kernel's heuristic wins when it is one, else the
one declared first in the space: so a re-tune whose timings differ only by noise reproduces the
table, and a pick is never slower than the heuristic beyond noise. Each bucket is saved as soon as it is tuned, so an
interrupted run resumes where it stopped.
"""
from __future__ import annotations

import datetime
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .declare import KernelSpace, Target, bucket_str
from .table import Entry, Tables, current_versions


@dataclass
class Candidate:
    config: dict
    times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def us(self) -> float:
        s = sorted(self.times)
        return s[len(s) // 2]

    @property
    def spread(self) -> float:
        return max(self.times) - min(self.times) if self.times else 0.0


@dataclass
class BucketResult:
    kernel: str
    bucket: str
    pick: dict
    us: float
    ties: list[dict]
    candidates: list[Candidate]
    pruned: list[dict]
    heuristic: dict | None = None
    heuristic_us: float | None = None
    partial: bool = False             # a deadline stopped it before every candidate ran

    def as_dict(self) -> dict:
        """The evidence of one bucket: pick vs heuristic, ties, failures (JSON-able)."""
        return {"kernel": self.kernel, "bucket": self.bucket, "pick": self.pick,
                "us": round(self.us, 3), "heuristic": self.heuristic,
                "heuristic_us": None if self.heuristic_us is None else round(self.heuristic_us, 3),
                "ties": self.ties, "timed": len(self.candidates) - len(self.errors),
                "pruned": len(self.pruned), "partial": self.partial,
                "failed": [{"config": c.config, "error": c.error} for c in self.errors]}

    @property
    def errors(self) -> list[Candidate]:
        return [c for c in self.candidates if c.error]

    def time_of(self, config: dict) -> float | None:
        for c in self.candidates:
            if c.config == config and not c.error:
                return c.us
        return None


def _limited(configs: list[dict], heur: dict, limit: int | None, seed: int = 0) -> list[dict]:
    """At most `limit` configs: the heuristic (when it is a candidate) and a reproducible draw
    of the others, kept in the space's order (so the tie-break stays the declared order)."""
    if limit is None or len(configs) <= limit:
        return configs
    rest = [i for i, c in enumerate(configs) if c != heur]
    random.Random(seed).shuffle(rest)
    keep = set(rest[:max(0, limit - (1 if heur in configs else 0))])
    return [c for i, c in enumerate(configs) if i in keep or c == heur]


def _run(cand: Candidate, runner, timer: Callable, repeats: int) -> None:
    try:
        fn = runner.build(cand.config)
        if not runner.check(cand.config):
            cand.error = "wrong result (differs from the reference)"
            return
        cand.times = [float(timer(fn)) for _ in range(max(1, repeats))]
    except Exception as e:  # noqa: BLE001 - a config that cannot run here is reported, not fatal
        cand.error = f"{type(e).__name__}: {str(e)[:200]}"


def tune_bucket(ks: KernelSpace, problem: Mapping, runner, *, timer: Callable, target: Target,
                repeats: int = 3, tie_rel: float = 0.02, limit: int | None = None,
                deadline: float | None = None, clock: Callable[[], float] = time.monotonic,
                spread_cap: float = 0.05) -> BucketResult:
    """limit: time at most this many of the bucket's valid configs (the heuristic always,
    the rest drawn reproducibly). A heuristic outside the space ({} = the plan's own choice)
    is timed too and may win (last in the tie-break). deadline (a `clock()` value): the
    heuristic is timed first and no further candidate starts after it; the pick is among
    those timed (`BucketResult.partial` says so)."""
    heur = ks.heuristic_for(problem, target)
    configs, pruned = ks.candidates(problem, target)
    configs = _limited(configs, heur, limit)
    if heur not in configs:
        # a heuristic outside the space ({}: the plan decides) competes last: a table entry
        # of it means "the kernel's own choice", and ties go to the declared configs
        configs = configs + [heur]
    cands = [Candidate(cfg) for cfg in configs]
    order = sorted(range(len(cands)), key=lambda i: cands[i].config != heur)  # heuristic first
    timed = 0
    for i in order:
        if deadline is not None and timed and clock() >= deadline:
            break
        _run(cands[i], runner, timer, repeats)
        timed += 1
    partial = timed < len(cands)
    cands = [c for c in cands if c.times or c.error]   # those not reached are left out
    ok = [c for c in cands if not c.error]
    bucket = bucket_str(ks.bucket(problem))
    if not ok:
        raise RuntimeError(f"{ks.kernel} [{bucket}]: no config ran; "
                           f"{len(pruned)} pruned, errors: {[c.error for c in cands[:3]]}")
    best = min(ok, key=lambda c: c.us)
    # within noise of the best: tie_rel, or the best's own spread (capped, so one noisy
    # measurement cannot make a slow config a tie)
    noise = max(tie_rel * best.us, min(best.spread, spread_cap * best.us))
    ties = [c for c in ok if c.us - best.us <= noise]
    # among ties the heuristic (the incumbent) wins, else the first declared (`ok` keeps the
    # space's order): deterministic, and never slower than the heuristic beyond noise
    pick = next((c for c in ties if c.config == heur), ties[0])
    res = BucketResult(ks.kernel, bucket, dict(pick.config), pick.us,
                       [dict(c.config) for c in ties if c is not pick], cands, pruned, heur)
    res.heuristic_us = res.time_of(heur)
    res.partial = partial
    return res


def _entry(res: BucketResult, ks: KernelSpace, evidence: str | None) -> Entry:
    return Entry(kernel=res.kernel, bucket=res.bucket, config=res.pick, us=round(res.us, 3),
                 source_hash=ks.source_hash(), versions=dict(current_versions()),
                 ties=res.ties, date=datetime.date.today().isoformat(), evidence=evidence)


def tune(ks: KernelSpace, problems: Iterable[Mapping], *, device: str, device_name: str,
         timer: Callable, target: Target, tables: Tables | None = None, repeats: int = 3,
         tie_rel: float = 0.02, resume: bool = True, save: bool = True,
         evidence: str | None = None, progress: bool = True,
         limit: int | None = None) -> list[BucketResult]:
    """Tune each distinct bucket of `problems` on `device` ("cuda", "cpu"); entries go into the
    user table of `device_name` ("nvidia-h200"). With `resume`, buckets that already have a
    current user entry are skipped."""
    if ks.runner is None:
        raise ValueError(f"{ks.kernel}: the space declares no runner, so it cannot be tuned")
    tables = tables or Tables()
    user = tables.table(tables.user, device_name)
    src = ks.source_hash()
    todo, seen = [], set()
    for p in problems:
        b = bucket_str(ks.bucket(p))
        if b in seen:
            continue
        seen.add(b)
        old = user.entries.get((ks.kernel, b))
        if resume and old is not None and old.stale_reason(src) is None:
            continue
        todo.append(p)
    bar = _bar(len(todo), ks.kernel, progress)
    results = []
    for p in todo:
        res = tune_bucket(ks, p, ks.runner(p, device), timer=timer, target=target,
                          repeats=repeats, tie_rel=tie_rel, limit=limit)
        results.append(res)
        if save:
            user.put(_entry(res, ks, evidence))
            user.save()
        bar.update(1)
    bar.close()
    return results


@dataclass
class RepeatReport:
    buckets: int
    changed: list[dict]               # bucket, old, new, old_us, new_us (same run)
    worst_rel_diff: float             # max |t(new pick) - t(old pick)| / t(old pick)

    def as_dict(self) -> dict:
        return {"buckets": self.buckets, "changed": self.changed,
                "worst_rel_diff": round(self.worst_rel_diff, 4)}

    def summary(self) -> str:
        return (f"{len(self.changed)} of {self.buckets} buckets changed their pick; worst time "
                f"difference between the two picks {self.worst_rel_diff:.1%}")


def repeat_report(ks: KernelSpace, old: Mapping[str, dict], new: list[BucketResult]) -> RepeatReport:
    """Compare a re-tune with earlier picks (bucket -> config), timing both in the new run."""
    changed, worst = [], 0.0
    for res in new:
        before = old.get(res.bucket)
        if before is None:
            continue
        t_old = res.time_of(before)
        if t_old is None:         # the old pick failed or was not drawn this time
            changed.append({"bucket": res.bucket, "old": before, "new": res.pick,
                            "old_us": None, "new_us": res.us})
            continue
        diff = abs(res.us - t_old) / t_old if t_old else 0.0
        worst = max(worst, diff)
        if before != res.pick and before not in res.ties:
            changed.append({"bucket": res.bucket, "old": before, "new": res.pick,
                            "old_us": t_old, "new_us": res.us})
    return RepeatReport(sum(1 for r in new if r.bucket in old), changed, worst)


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _bar(total: int, desc: str, enabled: bool):
    if not enabled or total == 0:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the serve extra
        return _NoBar()
    return tqdm(total=total, desc=f"tune {desc}", unit="bucket")
