"""`python -m serve.bench agentic`: session model, metrics arithmetic, and a CPU smoke run of
2 sessions x 3 turns against the embedded default model (prefix cache on and off)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serve.bench import report, sessions
from serve.bench.client import RequestRecord, counter

EXAMPLE = "serve/bench/examples/agent_sessions.jsonl"


def test_synthetic_sessions_are_seeded_and_shaped():
    a = sessions.synthetic_sessions(3, seed=7, system_tokens=50, context_tokens=200, turns=(2, 4),
                                    turn_tokens=30, output_tokens=(5, 9), think_time_s=0.5)
    b = sessions.synthetic_sessions(3, seed=7, system_tokens=50, context_tokens=200, turns=(2, 4),
                                    turn_tokens=30, output_tokens=(5, 9), think_time_s=0.5)
    assert [[t.new_messages for t in s.turns] for s in a] == [[t.new_messages for t in s.turns] for s in b]
    systems = {s.turns[0].new_messages[0]["content"] for s in a}
    assert len(systems) == 1                                    # one shared system prompt
    contexts = [s.turns[0].new_messages[1]["content"] for s in a]
    assert len(set(contexts)) == 3                              # each session its own repository
    for s in a:
        assert 2 <= s.num_turns <= 4 and s.turns[0].think_time_s == 0
        assert all(5 <= t.max_tokens <= 9 for t in s.turns)
        assert all(len(t.new_messages) == 1 and t.new_messages[0]["role"] == "user" for t in s.turns[1:])
        # ~1 word per requested token (plus a short tag)
        assert 200 <= len(s.turns[0].new_messages[1]["content"].split()) <= 215
    c = sessions.synthetic_sessions(3, seed=8, system_tokens=50, context_tokens=200)
    assert c[0].turns[0].new_messages != a[0].turns[0].new_messages
    with pytest.raises(ValueError, match="turns"):
        sessions.synthetic_sessions(1, turns=(3, 2))


def test_jsonl_example_and_errors(tmp_path):
    loaded = sessions.load_jsonl(EXAMPLE)
    assert [s.num_turns for s in loaded] == [3, 2]
    first = loaded[0]
    assert [m["role"] for m in first.turns[0].new_messages] == ["system", "user"]
    assert first.turns[1].new_messages[0]["role"] == "tool"
    assert [t.think_time_s for t in first.turns] == [0.0, 0.5, 0.8]
    assert sessions.load_jsonl(EXAMPLE, tool_role=False)[0].turns[1].new_messages[0]["role"] == "user"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(ValueError, match="must follow"):
        sessions.load_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
        sessions.load_jsonl(bad)


def _rec(session, turn, sent, times, prompt, completion, cached=None, error=None):
    r = RequestRecord(session=session, turn=turn, sent=sent, chunk_times=list(times),
                      prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                      error=error)
    if times:
        r.first_token, r.last_token = times[0], times[-1]
    return r


def test_summarize_arithmetic():
    recs = [_rec("a", 0, 0.0, [0.5, 0.6, 0.7], 100, 3),
            _rec("a", 1, 1.0, [1.1, 1.2, 1.3], 150, 3, cached=96),
            _rec("b", 0, 0.0, [1.0, 1.25, 1.5], 100, 3),
            _rec("b", 1, 2.0, [], None, None, error="http_429")]
    m = report.summarize(recs, wall_s=60.0, num_gpus=2,
                         server_before={"serve_prefix_cache_hit_tokens_total": 10,
                                        "serve_prefix_cache_query_tokens_total": 100},
                         server_after={"serve_prefix_cache_hit_tokens_total": 106,
                                       "serve_prefix_cache_query_tokens_total": 450})
    assert m["requests"] == 4 and m["ok"] == 3 and m["errors"] == {"http_429": 1}
    assert m["ttft_first_turn_ms"]["p50"] == pytest.approx(500.0)       # 0.5 and 1.0 s
    assert m["ttft_first_turn_ms"]["mean"] == pytest.approx(750.0)
    assert m["ttft_later_turns_ms"]["p50"] == pytest.approx(100.0)
    assert m["itl_ms"]["p50"] == pytest.approx(100.0) and m["itl_ms"]["p99"] == pytest.approx(250.0)
    assert m["tps_per_user"]["p50"] == pytest.approx(10.0)               # 2 tokens / 0.2 s
    assert m["output_tokens"] == 9 and m["tpm_per_gpu"] == pytest.approx(9 / 1 / 2)
    reuse = m["prefix_reuse_client"]
    assert reuse == {"reusable_tokens": 103, "cached_tokens": 96, "hit_of_reusable": 96 / 103}
    assert m["prefix_reuse_server"]["prefix_hit_rate"] == pytest.approx(96 / 350)
    assert counter({'x_total{a="1"}': 2.0, "x_total": 3.0}, "x_total") == 5.0
    assert report.percentiles([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_pareto_plot_and_best_point(tmp_path):
    def point(c, tps, tpm):
        return {"concurrency": c, "metrics": {"tps_per_user": {"p50": tps}, "tpm_per_gpu": tpm}}
    runs = [{"label": "on", "points": [point(1, 120, 1000), point(8, 75, 6000), point(32, 40, 9000)]},
            {"label": "off", "points": [point(1, 100, 800), point(8, 50, 3000)]}]
    assert report.best_under_line(runs[0]["points"])["concurrency"] == 8
    assert report.best_under_line(runs[1]["points"])["concurrency"] == 1
    png = report.pareto_plot(runs, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.timeout(900)
def test_cpu_smoke_run_default_model(tmp_path):
    """2 sessions x 3 turns on the embedded model, cache on and off: sane metrics, later turns
    served mostly from the prefix cache, and the ablation reports no reuse."""
    out = tmp_path / "agentic.json"
    cmd = [sys.executable, "-m", "serve.bench", "agentic",
           "--launch", "default --device cpu --max-model-len 2048",
           "--ablation", "--concurrency", "2", "--sessions", "2", "--turns", "3",
           "--system-tokens", "64", "--context-tokens", "400", "--turn-tokens", "60",
           "--output-tokens", "8", "--think-time", "0.05", "--duration", "400",
           "--json", str(out), "--plot", str(tmp_path / "pareto.png"),
           "--server-log", str(tmp_path / "server.log")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    assert "TTFTn p50" in proc.stdout
    result = json.loads(out.read_text())
    on, off = result["runs"]
    for run in (on, off):
        m = run["points"][0]["metrics"]
        assert m["requests"] == 6 and m["ok"] == 6 and m["errors"] == {}, m
        assert m["output_tokens"] == 6 * 8
        assert m["ttft_first_turn_ms"]["p50"] > 0 and m["ttft_later_turns_ms"]["p50"] > 0
        assert m["itl_ms"]["p50"] > 0 and m["tps_per_user"]["p50"] > 0 and m["tpm_per_gpu"] > 0
        assert m["prefix_reuse_client"]["reusable_tokens"] > 4 * 400
    hit_on = on["points"][0]["metrics"]["prefix_reuse_client"]["hit_of_reusable"]
    assert hit_on >= 0.8, on["points"][0]["metrics"]["prefix_reuse_client"]
    srv = on["points"][0]["metrics"]["prefix_reuse_server"]
    assert srv["prefix_hit_tokens"] > 0 and srv["prefix_query_tokens"] > 0
    assert off["points"][0]["metrics"]["prefix_reuse_client"]["cached_tokens"] == 0
    assert (tmp_path / "pareto.png").stat().st_size > 5000
