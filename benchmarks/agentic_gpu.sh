#!/usr/bin/env bash
# Lab script: the agentic benchmark on the H200 (issue 20's runs) — dummy Llama-3-8B bf16,
# 50k-token first turns then ~800-token tool turns, prefix cache on and off, one JSON + plot.
#   device run (after the scheduler extension is built there): bash benchmarks/agentic_gpu.sh
# Env: CONC (default "1"), SESSIONS (2), TURNS (3), MODEL (dummy:llama-3-8b).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpuwhl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The dummy model borrows the default model's tokenizer; only its tokenizer files travel
# (TOKCACHE: a copy of ~/.cache/tskernels/models with an empty model.safetensors).
[ -n "${TOKCACHE:-}" ] && export TSKERNELS_CACHE=$PWD/$TOKCACHE
python -c "import scheduler._core" 2>/dev/null || pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
timeout "${AGENTIC_TIMEOUT:-420}" python -m serve.bench agentic \
    --launch "${MODEL:-dummy:llama-3-8b} --device cuda --max-model-len 65536" --ablation \
    --endpoint chat --concurrency "${CONC:-1}" --sessions "${SESSIONS:-2}" \
    --turns "${TURNS:-3}" --system-tokens 2000 --context-tokens 48000 --turn-tokens 800 \
    --output-tokens 300 --think-time 0.2 --duration 180 \
    --json "$OUT/agentic_llama8b.json" --plot "$OUT/agentic_llama8b.png" \
    --server-log "$OUT/agentic_server.log"
echo "agentic rc $?"
tail -5 "$OUT/agentic_server.log"
