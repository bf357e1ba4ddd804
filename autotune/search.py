"""Search a Space: time every (or a sampled subset of) config and keep the fastest.

A config that fails to build or run (too much shared memory, a compiler error) is recorded
with its error and skipped, never fatal; `check` can reject wrong results before timing.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .space import Space


@dataclass
class Result:
    config: dict
    us: float
    table: list[dict] = field(default_factory=list)  # every tried config: us or error


def search(space: Space, build: Callable[[dict], Callable[[], object]], *,
           timer: Callable[[Callable[[], object]], float], max_configs: int | None = None,
           check: Callable[[dict], bool] | None = None, seed: int = 0) -> Result:
    """build(cfg) returns the zero-argument function to time for cfg."""
    configs = space.sample(max_configs, seed) if max_configs else list(space)
    table: list[dict] = []
    best: tuple[float, dict] | None = None
    for cfg in configs:
        try:
            fn = build(cfg)
            if check is not None and not check(cfg):
                table.append({"config": cfg, "error": "wrong result"})
                continue
            us = timer(fn)
        except Exception as e:  # config not buildable here: note it, move on
            table.append({"config": cfg, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        table.append({"config": cfg, "us": us})
        if best is None or us < best[0]:
            best = (us, cfg)
    if best is None:
        raise RuntimeError(f"no config in the space ran; errors: {table[:3]}")
    return Result(best[1], best[0], table)
