"""Metrics of one benchmark point, the printed table, and the TPS/user vs TPM/GPU Pareto plot."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .client import RequestRecord, counter

# The operating point peers report: throughput per GPU subject to this reading speed per user.
TPS_PER_USER_LINE = 70.0


def percentiles(values: list[float], qs=(50, 90, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles plus the mean; None for an empty list."""
    if not values:
        return {**{f"p{q}": None for q in qs}, "mean": None}
    v = sorted(values)
    out = {f"p{q}": v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))] for q in qs}
    out["mean"] = sum(v) / len(v)
    return out


def _ms(d: dict) -> dict:
    return {k: (None if x is None else round(x * 1e3, 3)) for k, x in d.items()}


def summarize(records: list[RequestRecord], wall_s: float, *, num_gpus: int = 1,
              server_before: dict | None = None, server_after: dict | None = None) -> dict:
    """Everything the issue asks of one run: latencies, throughput, prefix reuse, errors."""
    ok = [r for r in records if r.ok]
    first = [r.ttft for r in ok if r.turn == 0 and r.ttft is not None]
    later = [r.ttft for r in ok if r.turn > 0 and r.ttft is not None]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [1.0 / x for r in ok if (x := r.decode_rate)]
    rates = [x for r in ok if (x := r.decode_rate)]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    minutes = max(wall_s, 1e-9) / 60.0

    # Prefix reuse seen from the token streams: a later turn can reuse everything the previous
    # turn of its session sent and got back (its prompt + its output).
    by_turn = {(r.session, r.turn): r for r in ok}
    reusable = cached = 0
    for r in ok:
        prev = by_turn.get((r.session, r.turn - 1))
        if r.turn == 0 or prev is None or prev.prompt_tokens is None:
            continue
        reusable += prev.prompt_tokens + prev.output_tokens
        cached += r.cached_tokens or 0
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1

    server = None
    if server_before is not None and server_after is not None:
        def delta(*names):
            a, b = counter(server_before, *names), counter(server_after, *names)
            return None if a is None or b is None else b - a
        hit = delta("prefix_cache_hit_tokens_total", "prefix_cache_hit_tokens")
        query = delta("prefix_cache_query_tokens_total", "prefix_cache_query_tokens")
        server = {"prefix_hit_tokens": hit, "prefix_query_tokens": query,
                  "prefix_hit_rate": (hit / query) if hit is not None and query else None,
                  # the engine's step timeline (recent decode-graph replays; GPU servers)
                  "decode_host_gap_us_p50": counter(server_after,
                                                    "decode_host_gap_microseconds_p50"),
                  "decode_host_gap_us_p99": counter(server_after,
                                                    "decode_host_gap_microseconds_p99")}
    return {
        "requests": len(records), "ok": len(ok), "errors": errors,
        "sessions": len({r.session for r in records}), "wall_s": round(wall_s, 3),
        "ttft_first_turn_ms": _ms(percentiles(first)),
        "ttft_later_turns_ms": _ms(percentiles(later)),
        "itl_ms": _ms(percentiles(itl)), "tpot_ms": _ms(percentiles(tpot)),
        "tps_per_user": percentiles(rates),
        "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
        "tpm_per_gpu": out_tokens / minutes / num_gpus,
        "total_tpm_per_gpu": (out_tokens + prompt_tokens) / minutes / num_gpus,
        "prefix_reuse_client": {"reusable_tokens": reusable, "cached_tokens": cached,
                                "hit_of_reusable": (cached / reusable) if reusable else None},
        "prefix_reuse_server": server,
    }


def _f(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table(runs: list[dict]) -> str:
    """One row per (run, concurrency point)."""
    head = ("run", "conc", "ok/req", "TTFT1 p50", "TTFTn p50", "TTFTn p90", "ITL p50", "TPS/user",
            "TPM/GPU", "hit(client)", "hit(server)", "errors")
    rows = [head]
    for run in runs:
        for p in run["points"]:
            m = p["metrics"]
            srv = (m.get("prefix_reuse_server") or {}).get("prefix_hit_rate")
            rows.append((run["label"], str(p["concurrency"]), f"{m['ok']}/{m['requests']}",
                         _f(m["ttft_first_turn_ms"]["p50"]), _f(m["ttft_later_turns_ms"]["p50"]),
                         _f(m["ttft_later_turns_ms"]["p90"]), _f(m["itl_ms"]["p50"], 2),
                         _f(m["tps_per_user"]["p50"]), _f(m["tpm_per_gpu"], 0),
                         _f(m["prefix_reuse_client"]["hit_of_reusable"], 3), _f(srv, 3),
                         ",".join(f"{k}:{v}" for k, v in m["errors"].items()) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(latencies in ms; TTFT1 = first turns, TTFTn = later turns)"


def best_under_line(points: list[dict], line: float = TPS_PER_USER_LINE) -> dict | None:
    """The point with the most TPM/GPU among those keeping median TPS/user >= `line`."""
    good = [p for p in points if (p["metrics"]["tps_per_user"]["p50"] or 0) >= line]
    return max(good, key=lambda p: p["metrics"]["tpm_per_gpu"], default=None)


def pareto_plot(runs: list[dict], path: str | Path, *, title: str = "",
                line: float = TPS_PER_USER_LINE) -> Path:
    """TPS/user (x) against TPM/GPU (y), one curve per run, points labelled by concurrency."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:   # pragma: no cover - matplotlib is in the bench/test extras
        raise RuntimeError("the Pareto plot needs matplotlib: pip install 'tskernels[bench]'") from e
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for run in runs:
        pts = [(p["metrics"]["tps_per_user"]["p50"], p["metrics"]["tpm_per_gpu"], p["concurrency"])
               for p in run["points"] if p["metrics"]["tps_per_user"]["p50"] is not None]
        if not pts:
            continue
        xs, ys, cs = zip(*pts)
        ax.plot(xs, ys, marker="o", label=run["label"])
        for x, y, c in pts:
            ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axvline(line, color="red", linestyle="--", linewidth=1, label=f"{line:g} TPS/user")
    ax.set_xlabel("TPS per user (median decode tokens/s of a request)")
    ax.set_ylabel("TPM per GPU (output tokens/min)")
    ax.set_title(title or "agentic sessions: throughput vs per-user speed")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def load_runs(paths: list[str | Path]) -> list[dict]:
    """The runs of one or more result files written by `python -m serve.bench agentic --json`."""
    runs = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        runs += data["runs"]
    return runs
