"""Third-party kernels through Python entry points (group "tskernels.plugins").

A plugin package declares, in its pyproject.toml:

    [project.entry-points."tskernels.plugins"]
    mykernels = "mykernels.tsk:register"

where `register()` (or the module itself, on import) calls `tskernels.register(...)` /
`tskernels.registry.add(...)`, usually with band="plugin". Plugins load lazily, the first time
the registry is consulted; a plugin that fails to load is reported, never fatal. Set
TSKERNELS_NO_PLUGINS=1 to skip them.

    python -m tskernels.plugins list
"""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from importlib.metadata import entry_points

GROUP = "tskernels.plugins"


@dataclass
class PluginRecord:
    name: str
    target: str
    distribution: str
    error: str | None = None
    kernels: list[str] = field(default_factory=list)


loaded: list[PluginRecord] = []


def load_all() -> list[PluginRecord]:
    """Load every installed plugin once; returns the records (also kept in `loaded`)."""
    from . import registry

    if loaded or os.environ.get("TSKERNELS_NO_PLUGINS") == "1":
        return loaded
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if getattr(ep, "dist", None) else "?"
        rec = PluginRecord(ep.name, ep.value, dist)
        before = {k.name for lst in registry._kernels.values() for k in lst}
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception:
            rec.error = traceback.format_exc(limit=3).strip().splitlines()[-1]
        rec.kernels = sorted({k.name for lst in registry._kernels.values() for k in lst} - before)
        loaded.append(rec)
    return loaded


def main(argv: list[str] | None = None) -> int:
    # Under `python -m tskernels.plugins` this file runs as __main__; the registry fills the
    # `loaded` list of the imported module, so read that one.
    from tskernels import plugins as this
    from tskernels import registry

    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["list"]):
        print("usage: python -m tskernels.plugins list", file=sys.stderr)
        return 2
    registry.kernels()  # loads built-ins and plugins
    loaded = this.loaded
    if not loaded:
        print(f"no plugins installed (entry-point group {GROUP!r})")
    for rec in loaded:
        state = f"ERROR: {rec.error}" if rec.error else f"{len(rec.kernels)} kernel(s)"
        print(f"{rec.name:<20} {rec.target:<40} [{rec.distribution}] {state}")
        for name in rec.kernels:
            print(f"    {name}")
    print(f"\nbuilt-in and plugin kernels: {len(registry.kernels())}")
    for k in registry.kernels():
        print(f"  {k.name:<40} band={k.band:<11} run={','.join(sorted(k.verification.run)) or '-'}"
              f" compiled={','.join(sorted(k.verification.compiled)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
