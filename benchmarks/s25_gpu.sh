# Session 25 device stages. Each stage runs under its own limit; 0 (the default) skips it.
#   GEMV_S: benchmarks/s25_gemv_gpu.py (M = 1 gemv: shipped rows vs a persistent
#           double-buffered rows form vs a pure read of the same bytes)
#   PROF_S: the Qwen3-30B-A3B-shaped B = 1 decode step with every PDL chain off (kernel times
#           that add up: chained kernels count their wait as device time), and with it on
#   SAMP_S: benchmarks/s25_sampler_gpu.py (the sampler's launches chained by PDL vs plain)
#   TEST_S / TESTS: a pytest -m gpu run over TESTS
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs -> s25_gpu_tier.json
#   BENCH_S / BENCH_OPS: tskernels-bench OP --graph for each op in BENCH_OPS
#   PERSIST_AB=1: AB_SETS from the gemv sweep (below)
#   AB_S / AB_MODEL(S) / AB_SETS: serve_ab.py at B = 1 per model ("tag:--set a=b|tag2:..." one engine each)
source benchmarks/gpu_setup.sh
stage gemv "${GEMV_S:-0}" python benchmarks/s25_gemv_gpu.py "$OUT" $(( ${GEMV_S:-0} - 40 ))
QWEN=dummy:benchmarks/configs/qwen3-30b-a3b.json
stage prof_nopdl "${PROF_S:-0}" python benchmarks/serve_ab.py \
    --set "tskernels.ops.shared.pdl.CHAIN=()" --set tskernels.ops.gemm.triton_gemv.USE_PDL=0 \
    -- --model $QWEN --batch 1 --new-tokens 48 --no-hf --profile --json "$OUT/s25_qwen3_prof_nopdl.json"
stage samp "${SAMP_S:-0}" python benchmarks/s25_sampler_gpu.py "$OUT" $(( ${SAMP_S:-0} - 30 ))
TAIL=30 stage tests "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider -n 4 --timeout 200 ${TESTS:-tests/kernels}
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s25_gpu_tier${TAG:-}.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
for op in ${BENCH_OPS:-}; do
  stage "bench_$op" "${BENCH_S:-0}" tskernels-bench "$op" --graph --json "$OUT/s25_bench_$op.json"
done
# PERSIST_AB=1: after the gemv sweep, serve with the persistent rows gemv (s25_persist_sets.py:
# one config everywhere, or a per-shape table) and with the shipped launches, one engine each
if [ "${PERSIST_AB:-0}" = 1 ] && [ -f "$OUT/s25_gemv.json" ]; then
  AB_SETS="shipped:|$(python benchmarks/s25_persist_sets.py "$OUT/s25_gemv.json")|shipped2:"
  echo "AB_SETS: $AB_SETS"
fi
for MODEL in ${AB_MODELS:-${AB_MODEL:-dummy:llama-3-8b}}; do
  tag=${MODEL##*/}; tag=${tag%.json}; tag=${tag#dummy:}
  IFS='|' read -ra sets <<< "${AB_SETS:-}"
  for v in "${sets[@]}"; do
    vtag=${v%%:*}
    stage "ab_${tag}_$vtag" "${AB_S:-0}" python benchmarks/serve_ab.py ${v#*:} -- --model "$MODEL" \
        --batch ${AB_BATCH:-1} --new-tokens 48 --no-hf --json "$OUT/s25_ab_${tag}_$vtag.json"
  done
done
# the device returns ~8 files: everything goes back in one archive (the json and logs removed)
cd "$OUT" && tar czf /tmp/s25_out.tgz * 2>/dev/null && rm -rf "$OUT"/* && mv /tmp/s25_out.tgz "$OUT/"; true
