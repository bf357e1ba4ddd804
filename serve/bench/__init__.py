"""Serving benchmarks: `python -m serve.bench agentic` replays multi-turn agent sessions over the
OpenAI API (any compatible server, or one it launches) and reports TTFT of first and later
turns, ITL / TPOT, TPS per user, TPM per GPU, prefix-cache reuse and errors, with a Pareto plot
of TPS/user against TPM/GPU. See `serve/bench/__main__.py` for the flags and
`serve/bench/sessions.py` for the session model and the JSONL schema.
"""
