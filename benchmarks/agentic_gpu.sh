#!/usr/bin/env bash
# Lab script: issue 20's H200 runs. Carry `.gpuwhl` (server wheels, the default model's tokenizer
# in .gpuwhl/tokcache, and a cp312 build of scheduler/_core in .gpuwhl/sched312 made on the
# development machine; without it the extension is built here).
#   STAGE=moe: the Qwen3-30B-A3B-shaped sweep over the API alone
#   STAGE=engine: GPU tests of overlap / graph sampling (tests/serve/test_overlap.py) and the
#     in-process figures (benchmarks/agentic_engine_bench.py): conc-1 later-turn TTFT on a 50k
#     context, prefix hit, uncached ratio, B=1 ITL vs SoL, host gap at B=64 overlap on / off
#   STAGE=gap: the B=64 host gap alone (overlap with lookahead on / off, no overlap, sampled;
#     GAP_MODES picks), then the GPU tests; STAGE=all: gap, then http
#   STAGE=http: `python -m serve.bench agentic` sweeps over the OpenAI API for the dummy
#     Llama-3-8B (+ a prefix-cache-off run at conc 1) and the Qwen3-30B-A3B-shaped MoE; Pareto PNGs
# Env: CONC (sweep, "1,4,8"), TURNS (3), OUTPUT (64), LLAMA / MOE (model specs); for a CPU dry
# run: SETUP=0 DEVICE=cpu SYS / CTX / MAXLEN (system / context tokens, --max-model-len), tiny models.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGE=${STAGE:-engine}
if [ "${SETUP:-1}" = 1 ]; then   # SETUP=0: a dry run on the development machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .gpuwhl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD TSKERNELS_CACHE=$PWD/.gpuwhl/tokcache
  cp .gpuwhl/sched312/_core*.so scheduler/ 2>/dev/null
  python -c "import scheduler._core" 2>/dev/null || pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
fi
export PYTHONUNBUFFERED=1
LLAMA=${LLAMA:-dummy:benchmarks/configs/llama-3-8b-64k.json}
MOE=${MOE:-dummy:benchmarks/configs/qwen3-30b-a3b-64k.json}
MOE_BACKENDS=${MOE_BACKENDS-moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton}

tests() {
  timeout "${TEST_S:-60}" python -m pytest -m gpu -q -x -p no:cacheprovider tests/serve/test_overlap.py \
      > "$OUT/agentic_gpu_tests.log" 2>&1
  echo "gpu tests rc $?"; tail -3 "$OUT/agentic_gpu_tests.log"
}
if [ "$STAGE" = engine ]; then
  timeout "${ENGINE_S:-100}" python benchmarks/agentic_engine_bench.py --model "$LLAMA" \
      --json "$OUT/agentic_engine_llama8b.json" 2>&1 | grep -v -i warn | tail -8
  tests
fi
if [ "$STAGE" = gap ] || [ "$STAGE" = all ]; then   # the B=64 host gap alone, then the tests
  # lookahead right after plain overlap: the on / off pair first, should the time limit hit
  timeout "${ENGINE_S:-60}" python benchmarks/agentic_engine_bench.py --model "$LLAMA" --skip-conc1 \
      --gap-steps 100 --gap-modes "${GAP_MODES:-overlap,lookahead,plain,sampled}" \
      --json "$OUT/agentic_engine_gap_llama8b.json" 2>&1 | grep -v -i warn | tail -4
  tests   # (its Triton JIT on a cold cache took > 35 s: TEST_S 60)
fi

gpu_idle() {  # the previous server's engine process may still hold its GPU memory for seconds
  for _ in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [ -z "$used" ] || [ "$used" -lt 4000 ] && return; sleep 0.5
  done
}
bench() {  # label model json-name extra-server-args extra-bench-args
  gpu_idle
  timeout "${BENCH_S:-80}" python -m serve.bench agentic \
      --launch "$2 --device ${DEVICE:-cuda} --max-model-len ${MAXLEN:-57344} --max-num-seqs 8 $4" \
      --endpoint completions --concurrency "$6" --sessions-factor 1 \
      --turns "${TURNS:-3}" --system-tokens ${SYS:-2000} --context-tokens ${CTX:-48000} --turn-tokens ${TURN:-800} \
      --output-tokens "${OUTPUT:-64}" --think-time 0.1 --duration 40 --label "$1" \
      --json "$OUT/$3.json" $5 --server-log "$OUT/agentic_server.log" 2>&1 | tail -8
}

if [ "$STAGE" = http ] || [ "$STAGE" = all ]; then
  BENCH_S=${LLAMA_S:-85} bench "llama-3-8b dummy, prefix cache on" "$LLAMA" agentic_llama8b "" "" "${CONC:-1,4,8}"
  BENCH_S=${NOCACHE_S:-45} bench "llama-3-8b dummy, prefix cache off" "$LLAMA" agentic_llama8b_nocache \
      "--no-enable-prefix-caching" "" 1
  python -m serve.bench plot "$OUT/agentic_llama8b.json" "$OUT/agentic_llama8b_nocache.json" \
      -o "$OUT/agentic_pareto_llama8b.png" --title "dummy Llama-3-8B bf16, H200"
fi
if [ "$STAGE" = http ] || [ "$STAGE" = all ] || [ "$STAGE" = moe ]; then
  BENCH_S=${MOE_S:-85} TSKERNELS_BACKEND=$MOE_BACKENDS bench "qwen3-30b-a3b dummy (MoE)" "$MOE" agentic_qwen3moe "" "" \
      "${CONC:-1,4,8}"
  python -m serve.bench plot "$OUT/agentic_qwen3moe.json" -o "$OUT/agentic_pareto_qwen3moe.png" \
      --title "Qwen3-30B-A3B-shaped dummy bf16, H200"
  tail -c 3000 "$OUT/agentic_server.log" > "$OUT/agentic_server_tail.log"; rm -f "$OUT/agentic_server.log"
fi
