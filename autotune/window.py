"""A bounded tuning window at engine start: tune the captured buckets that have no entry.

The engine calls `tune_missing` once, before it captures CUDA graphs, with the rows of a
shape-capture file from earlier traffic (`capture.load`). Rows of this device whose kernel has
a declared, runnable space and whose bucket has no current *exact* entry are tuned, most
frequent first, until `budget_s` of `clock()` time is spent; each result goes into the user
table at once, so the next start finds it (and a window cut short resumes where it stopped).
A bucket the deadline interrupts keeps the candidates it timed (the heuristic first) and is
marked partial in the table's `evidence`; a later window with time left re-tunes it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .declare import Target, parse_bucket, spaces
from .lookup import Lookup
from .table import Tables
from .tune import _entry, tune_bucket

PARTIAL = "startup window (partial)"


@dataclass
class WindowReport:
    tuned: list[dict] = field(default_factory=list)     # kernel, bucket, pick, us, partial
    skipped: list[dict] = field(default_factory=list)   # kernel, bucket, why
    left: int = 0                                       # rows not reached in the budget
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"startup tuning: {len(self.tuned)} buckets tuned in {self.seconds:.1f} s, "
                f"{len(self.skipped)} skipped, {self.left} left for a later start")


def tune_missing(rows: Iterable[Mapping], *, budget_s: float, device: str, device_name: str,
                 target: Target, timer: Callable, tables: Tables | None = None,
                 clock: Callable[[], float] = time.monotonic, repeats: int = 3,
                 limit: int | None = None) -> WindowReport:
    """rows: capture rows {"kernel", "device", "bucket", "count"} (any order; the most
    frequent are tuned first). device: where the runners build inputs ("cuda");
    device_name: the table to fill ("nvidia-h200")."""
    if budget_s <= 0:
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    tables = tables or Tables()
    look = Lookup(tables)
    user = tables.table(tables.user, device_name)
    report = WindowReport()
    t0 = clock()
    deadline = t0 + budget_s
    todo = sorted((r for r in rows if r.get("device", device_name) == device_name),
                  key=lambda r: (-r.get("count", 0), r["kernel"], r["bucket"]))
    for i, row in enumerate(todo):
        ks = spaces().get(row["kernel"])
        why = None
        if ks is None:
            why = "no declared space"
        elif ks.runner is None:
            why = "the space declares no runner"
        if why:
            report.skipped.append({"kernel": row["kernel"], "bucket": row["bucket"], "why": why})
            continue
        problem = parse_bucket(row["bucket"])
        try:
            ch = look.choose(ks, problem, device_name, record=False, target=target)
        except Exception as e:  # noqa: BLE001 - a bad row or table must not stop the window
            report.skipped.append({"kernel": ks.kernel, "bucket": row["bucket"],
                                   "why": f"lookup failed: {type(e).__name__}: {str(e)[:200]}"})
            continue
        if ch.link == "exact" and not (ch.entry and ch.entry.evidence == PARTIAL):
            report.skipped.append({"kernel": ks.kernel, "bucket": row["bucket"],
                                   "why": "has an entry"})
            continue
        if clock() >= deadline:
            report.left = len(todo) - i
            break
        try:
            res = tune_bucket(ks, problem, ks.runner(problem, device), timer=timer,
                              target=target, repeats=repeats, limit=limit, deadline=deadline,
                              clock=clock)
        except Exception as e:  # noqa: BLE001 - a bucket that cannot be tuned must not stop the engine
            report.skipped.append({"kernel": ks.kernel, "bucket": row["bucket"],
                                   "why": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        user.put(_entry(res, ks, PARTIAL if res.partial else "startup window"))
        user.save()
        report.tuned.append({"kernel": ks.kernel, "bucket": res.bucket, "pick": res.pick,
                             "us": round(res.us, 3), "heuristic_us": res.heuristic_us,
                             "partial": res.partial})
    report.seconds = clock() - t0
    return report
