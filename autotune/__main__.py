"""`python -m autotune list | diff | prune | export | explain | tune`.

    python -m autotune list [--device nvidia-h200] [--kernel attention.decode] [--stale]
    python -m autotune diff OLD.json NEW.json
    python -m autotune prune [--device D] [--shipped] [--dry-run]     # drop stale entries
    python -m autotune export --device D -o FILE                       # user + shipped, merged
    python -m autotune explain attention.decode.triton --shape B=64,L=4096 [--device-name D]
    python -m autotune tune attention.decode --shapes B=64,L=4096 B=1,L=32768 [--repeat]
    python -m autotune tune attention.decode --from-capture shapes.json
    python -m autotune tune gemm --limit 12 --json out.json    # bench shapes, <= 12 configs

Kernels declare their spaces when their module is imported; the CLI imports `--spaces-module`
(default `tskernels.ops`) by name, so this package needs no import of the kernel package.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from . import capture
from .declare import Target, get_space, parse_bucket, spaces
from .lookup import Lookup
from .table import Table, Tables, device_family
from .timer import cpu_timer, cuda_graph_timer, cuda_timer
from .tune import repeat_report, tune


def _load_spaces(module: str) -> None:
    importlib.import_module(module)


def _matching(name: str) -> list:
    """The spaces named `name`, or under it ("gemm", "gemm.mm"); "all": every declared one."""
    found = [ks for k, ks in sorted(spaces().items())
             if name == "all" or k == name or k.startswith(name + ".")]
    if not found:
        raise SystemExit(f"autotune: no declared space matches {name!r}; declared: "
                         f"{', '.join(sorted(spaces())) or 'none'}")
    return found


def cmd_list(args, tables: Tables) -> int:
    srcs = {k: ks.source_hash() for k, ks in spaces().items()}
    rows = []
    for dev in [args.device] if args.device else tables.devices():
        for layer, t in zip(("user", "shipped"), tables.layers(dev)):
            for e in sorted(t.entries.values(), key=lambda e: (e.kernel, e.bucket)):
                if args.kernel and not e.kernel.startswith(args.kernel):
                    continue
                why = e.stale_reason(srcs.get(e.kernel)) if e.kernel in srcs else None
                if args.stale and why is None:
                    continue
                rows.append((dev, layer, e.kernel, e.bucket, json.dumps(e.config, sort_keys=True),
                             "-" if e.us is None else f"{e.us:.1f}", why or "current"))
    for r in rows:
        print("  ".join(r))
    print(f"{len(rows)} entries", file=sys.stderr)
    return 0


def cmd_diff(args, tables: Tables) -> int:
    a, b = Table.load(Path(args.old)), Table.load(Path(args.new))
    changed = 0
    for key in sorted(set(a.entries) | set(b.entries)):
        ea, eb = a.entries.get(key), b.entries.get(key)
        if ea is None:
            print(f"+ {key[0]} [{key[1]}] {eb.config}")
        elif eb is None:
            print(f"- {key[0]} [{key[1]}] {ea.config}")
        elif ea.config != eb.config:
            print(f"~ {key[0]} [{key[1]}] {ea.config} -> {eb.config}")
        else:
            continue
        changed += 1
    print(f"{changed} entries differ", file=sys.stderr)
    return 0


def cmd_prune(args, tables: Tables) -> int:
    srcs = {k: ks.source_hash() for k, ks in spaces().items()}
    dropped = 0
    for dev in [args.device] if args.device else tables.devices():
        layers = tables.layers(dev) if args.shipped else tables.layers(dev)[:1]
        for t in layers:
            stale = [e for e in t.entries.values()
                     if e.stale_reason(srcs.get(e.kernel) if e.kernel in srcs else None)]
            for e in stale:
                print(f"{'would drop' if args.dry_run else 'drop'} {t.path} {e.kernel} [{e.bucket}]:"
                      f" {e.stale_reason(srcs.get(e.kernel))}")
                if not args.dry_run:
                    t.remove(e.kernel, e.bucket)
            if stale and not args.dry_run:
                t.save()
            dropped += len(stale)
    print(f"{dropped} stale entries {'found' if args.dry_run else 'dropped'}", file=sys.stderr)
    return 0


def cmd_export(args, tables: Tables) -> int:
    user, shipped = tables.layers(args.device)
    merged = Table(Path(args.output), args.device, dict(shipped.entries))
    merged.entries.update(user.entries)
    merged.save()
    print(f"{len(merged.entries)} entries -> {args.output}", file=sys.stderr)
    return 0


def _problem(ks, text: str) -> dict:
    return ks.parse(text) if ks.parse else parse_bucket(text)


def cmd_explain(args, tables: Tables) -> int:
    ks = get_space(args.kernel)
    choice = Lookup(tables).choose(ks, _problem(ks, args.shape), args.device_name, record=False)
    print(choice.explain())
    fam = device_family(args.device_name)
    print(f"  device family: {fam or 'unknown'}")
    return 0


def cmd_tune(args, tables: Tables) -> int:
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        from .cache import device_key
        name = args.device_name or device_key("cuda")
        major, minor = torch.cuda.get_device_capability()
        arch = (torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
                if getattr(torch.version, "hip", None) else f"sm_{major}{minor}")
        timer = cuda_graph_timer if args.timer == "graph" else cuda_timer
    else:
        name, arch, timer = args.device_name or "cpu", "cpu", cpu_timer
    target = Target.for_arch(arch) if arch != "cpu" else Target("cpu", "cpu", 1 << 30, 1)
    rc = 0
    report: list[dict] = []
    repeats: list[dict] = []
    for ks in _matching(args.op):
        if args.from_capture:
            problems = [parse_bucket(s["bucket"]) for s in capture.load(args.from_capture)
                        if s["kernel"] == ks.kernel]
        elif args.shapes:
            problems = [_problem(ks, s) for s in args.shapes]
        else:                          # the space's own (bench) shapes
            problems = [dict(p) for p in ks.shapes]
        if not problems:
            print(f"{ks.kernel}: no shapes to tune", file=sys.stderr)
            continue
        if ks.runner is None:
            print(f"{ks.kernel}: declares no runner; skipped", file=sys.stderr)
            rc = 1
            continue
        # the picks in use: user entries over shipped ones
        old = {e.bucket: e.config for t in reversed(tables.layers(name))
               for e in t.for_kernel(ks.kernel)}
        try:
            results = tune(ks, problems, device=device, device_name=name, timer=timer,
                           target=target, tables=tables, repeats=args.repeats,
                           resume=not (args.repeat or args.force), save=not args.repeat,
                           progress=not args.quiet, limit=args.limit)
        except RuntimeError as e:       # no config of a bucket ran: report, tune the others
            print(f"{ks.kernel}: {e}", file=sys.stderr)
            report.append({"kernel": ks.kernel, "error": str(e)[:500]})
            rc = 1
            continue
        report.extend(r.as_dict() for r in results)
        for r in results:
            h = "-" if r.heuristic_us is None else f"{r.heuristic_us:.2f}"
            print(f"{ks.kernel} [{r.bucket}] pick {r.pick} {r.us:.2f} us (heuristic {h} us); "
                  f"{len(r.ties)} ties, {len(r.pruned)} pruned, {len(r.errors)} failed")
            for c in r.errors:
                print(f"  failed {c.config}: {c.error}")
        if args.repeat:
            rep = repeat_report(ks, old, results)
            print(f"{ks.kernel}: {rep.summary()}")
            repeats.append({"kernel": ks.kernel, **rep.as_dict()})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "repeat": args.repeat,
                                               "buckets": report, "repeat_report": repeats},
                                              indent=1) + "\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spaces-module", default="tskernels.ops",
                   help="module whose import declares the spaces")
    p.add_argument("--user-dir", help="user table directory (default: $TSKERNELS_CACHE/autotune)")
    p.add_argument("--shipped-dir", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("list")
    s.add_argument("--device")
    s.add_argument("--kernel")
    s.add_argument("--stale", action="store_true", help="only entries that are no longer used")
    s = sub.add_parser("diff")
    s.add_argument("old")
    s.add_argument("new")
    s = sub.add_parser("prune")
    s.add_argument("--device")
    s.add_argument("--shipped", action="store_true", help="also prune the shipped tables")
    s.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("export")
    s.add_argument("--device", required=True)
    s.add_argument("-o", "--output", required=True)
    s = sub.add_parser("explain")
    s.add_argument("kernel")
    s.add_argument("--shape", required=True)
    s.add_argument("--device-name", default="nvidia-h200")
    s = sub.add_parser("tune")
    s.add_argument("op", help="family, family.op, family.op.backend or all")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--shapes", nargs="+",
                   help="problems as k=v,k=v (the space's parser; default: its bench shapes)")
    g.add_argument("--from-capture", help="a TSKERNELS_CAPTURE_SHAPES file")
    s.add_argument("--repeat", action="store_true",
                   help="re-tune without saving; report how many buckets change their pick")
    s.add_argument("--force", action="store_true", help="re-tune buckets that have current entries")
    s.add_argument("--repeats", type=int, default=3, help="timings per config (median, spread)")
    s.add_argument("--device", choices=["cuda", "cpu"])
    s.add_argument("--device-name", help="table to write (default: this GPU's device key)")
    s.add_argument("--timer", choices=["eager", "graph"], default="graph",
                   help="CUDA timing: replays of a CUDA graph of 20 calls (default: no host "
                        "launch cost, what a serving graph sees; falls back to eager for a "
                        "launch that cannot be captured) or eager launches (CUDA events)")
    s.add_argument("--limit", type=int,
                   help="time at most N configs per bucket (the heuristic + a fixed draw)")
    s.add_argument("--json", help="write every bucket's pick, heuristic time and the repeat "
                                  "report to FILE")
    s.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    _load_spaces(args.spaces_module)
    from .table import SHIPPED
    tables = Tables(Path(args.user_dir) if args.user_dir else None,
                    Path(args.shipped_dir) if args.shipped_dir else SHIPPED)
    return {"list": cmd_list, "diff": cmd_diff, "prune": cmd_prune, "export": cmd_export,
            "explain": cmd_explain, "tune": cmd_tune}[args.cmd](args, tables)


if __name__ == "__main__":
    raise SystemExit(main())
