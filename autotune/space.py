"""Config spaces: the cartesian product of named choices, filtered by a constraint."""
from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence


class Space:
    def __init__(self, where: Callable[[dict], bool] | None = None, **choices: Sequence):
        if not choices:
            raise ValueError("Space needs at least one parameter with choices")
        for name, vals in choices.items():
            if len(vals) == 0:
                raise ValueError(f"Space: parameter {name!r} has no choices")
        self.choices = {k: list(v) for k, v in choices.items()}
        self.where = where

    def __iter__(self) -> Iterator[dict]:
        names = list(self.choices)
        for combo in itertools.product(*self.choices.values()):
            cfg = dict(zip(names, combo))
            if self.where is None or self.where(cfg):
                yield cfg

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def sample(self, n: int, seed: int = 0) -> list[dict]:
        """Up to n distinct valid configs, drawn reproducibly."""
        configs = list(self)
        random.Random(seed).shuffle(configs)
        return configs[:n]
