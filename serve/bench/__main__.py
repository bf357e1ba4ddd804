"""`python -m serve.bench agentic ...` (replay agent sessions) and `python -m serve.bench plot`.

Against a running server:   python -m serve.bench agentic --url http://127.0.0.1:8000
Launching one (and an ablation with the prefix cache off, plotted on the same axes):
    python -m serve.bench agentic --launch "dummy:llama-3-8b --device cuda" --ablation \\
        --concurrency 1,4,16,64 --json out.json --plot pareto.png
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from . import agentic, report, sessions


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI, got {text!r}") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return a, b


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agentic", help="replay multi-turn agent sessions over the OpenAI API",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    where = a.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of any OpenAI-compatible server")
    where.add_argument("--launch", metavar="ARGS",
                       help="start `python -m serve ARGS` on a free loopback port for the run")
    a.add_argument("--ablation", action="store_true",
                   help="with --launch: run the sweep again on a server with --no-enable-prefix-caching")
    a.add_argument("--model", help="model id (default: the first of /v1/models)")
    a.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="chat completions, or completions over the conversation as plain text "
                        "(models without a chat template, e.g. dummy: models)")
    a.add_argument("--api-key")
    a.add_argument("--concurrency", type=_ints, default=[1], help="sessions at once, a sweep: 1,4,16")
    a.add_argument("--sessions", type=int, default=None,
                   help="sessions per concurrency point (default: --sessions-factor x concurrency)")
    a.add_argument("--sessions-factor", type=float, default=2.0,
                   help="without --sessions: sessions per point = this x concurrency (at least 1)")
    a.add_argument("--duration", type=float, default=600.0, help="seconds per concurrency point (cap)")
    a.add_argument("--arrival-rate", type=float, default=0.0,
                   help="sessions arriving per second (Poisson); 0: all at once")
    a.add_argument("--jsonl", help="replay real sessions from this JSONL (schema: serve/bench/sessions.py)")
    a.add_argument("--tool-role", action="store_true",
                   help="send JSONL `tool` messages as tool turns (default: as user turns)")
    a.add_argument("--system-tokens", type=int, default=2000, help="shared system prompt")
    a.add_argument("--context-tokens", type=int, default=48000, help="repository context, first turn")
    a.add_argument("--turns", type=_range, default=(10, 15), help="turns per session, N or LO-HI")
    a.add_argument("--turn-tokens", type=int, default=800, help="tool output added per later turn")
    a.add_argument("--output-tokens", type=_range, default=(300, 500), help="max_tokens per turn")
    a.add_argument("--think-time", type=float, default=1.0, help="mean seconds between turns")
    a.add_argument("--temperature", type=float, default=0.0)
    a.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let replies end at EOS (default: exact lengths via ignore_eos)")
    a.add_argument("--request-timeout", type=float, default=600.0)
    a.add_argument("--num-gpus", type=int, default=1, help="GPUs the server uses (for TPM/GPU)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--label", default=None, help="name of this run in tables and plots")
    a.add_argument("--server-log", help="with --launch: append the server's output to this file")
    a.add_argument("--json", help="write the results here")
    a.add_argument("--plot", help="write the Pareto plot (PNG) here")
    pl = sub.add_parser("plot", help="Pareto plot of one or more result files on the same axes")
    pl.add_argument("results", nargs="+")
    pl.add_argument("-o", "--output", required=True)
    pl.add_argument("--title", default="")
    return p


def _make_sessions(args):
    if args.jsonl:
        loaded = sessions.load_jsonl(args.jsonl, tool_role=args.tool_role)
        return lambda c: loaded[: args.sessions or len(loaded)]

    def make(c: int):
        # A fresh seed per point: one point's sessions cannot hit the cache another one filled.
        return sessions.synthetic_sessions(
            args.sessions or max(1, round(args.sessions_factor * c)),
            seed=args.seed * 1_000_003 + c, system_tokens=args.system_tokens,
            context_tokens=args.context_tokens, turns=args.turns, turn_tokens=args.turn_tokens,
            output_tokens=args.output_tokens, think_time_s=args.think_time)
    return make


def run_agentic(args) -> dict:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    cfg = agentic.RunConfig(url=args.url or "", model=args.model, duration_s=args.duration,
                            arrival_rate=args.arrival_rate, request_timeout_s=args.request_timeout,
                            temperature=args.temperature, ignore_eos=args.ignore_eos,
                            num_gpus=args.num_gpus, api_key=args.api_key, seed=args.seed,
                            endpoint=args.endpoint)
    make = _make_sessions(args)
    runs = []
    result = {"benchmark": "agentic", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": "python -m serve.bench " + " ".join(sys.argv[1:]),
              "config": {k: v for k, v in vars(args).items() if k not in ("api_key",)},
              "runs": runs}

    def save(partial=None):
        if args.json:
            data = dict(result, runs=runs + [partial]) if partial else result
            Path(args.json).write_text(json.dumps(data, indent=1, default=str))

    if args.url:
        runs.append(agentic.sweep(cfg, make, args.concurrency, args.label or args.url, log, save))
    else:
        variants = [(args.label or "prefix cache on", args.launch)]
        if args.ablation:
            variants.append(("prefix cache off", args.launch + " --no-enable-prefix-caching"))
        for label, launch in variants:
            with agentic.LocalServer(launch, log_path=args.server_log) as server:
                cfg.url = server.url
                runs.append(agentic.sweep(cfg, make, args.concurrency, label, log, save))
    for run in runs:
        best = report.best_under_line(run["points"])
        run["best_under_line"] = None if best is None else {
            "concurrency": best["concurrency"], "tpm_per_gpu": best["metrics"]["tpm_per_gpu"]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    if args.plot:
        report.pareto_plot(runs, args.plot, title=args.label or "")
    return result


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)   # unwinds LocalServer: a launched server is stopped too


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = _parser().parse_args(argv)
    if args.cmd == "plot":
        report.pareto_plot(report.load_runs(args.results), args.output, title=args.title)
        print(args.output)
        return 0
    if args.ablation and not args.launch:
        _parser().error("--ablation needs --launch (it starts a second server with the cache off)")
    result = run_agentic(args)
    print(report.table(result["runs"]))
    for run in result["runs"]:
        b = run["best_under_line"]
        print(f"{run['label']}: " + (f"best TPM/GPU at >= {report.TPS_PER_USER_LINE:g} TPS/user: "
              f"{b['tpm_per_gpu']:.0f} (concurrency {b['concurrency']})" if b else
              f"no point reached {report.TPS_PER_USER_LINE:g} TPS/user"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
