# Session 26 device stages. Each stage runs under its own limit; 0 (the default) skips it.
#   DOT_S / DOT_KIND: benchmarks/s26_dot_gpu.py (the persistent tensor-core decode GEMM vs the
#           split kernel and cuBLAS; DOT_KIND 16bit / fp8 / both)
#   TEST_S / TESTS / TEST_K: a pytest -m gpu run over TESTS (-k TEST_K)
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs -> s26_gpu_tier.json
#   BENCH_S / BENCH_OPS: tskernels-bench OP --graph for each op in BENCH_OPS
#   AB_S / AB_MODELS / AB_SETS / AB_BATCHES: serve_ab.py per model ("tag:--set a=b|tag2:..." one engine each); AB_EXTRA: more serve_gpu_bench args
source benchmarks/gpu_setup.sh
stage dot "${DOT_S:-0}" python benchmarks/s26_dot_gpu.py "$OUT" $(( ${DOT_S:-0} - 40 )) ${DOT_KIND:-both}
TAIL=30 stage tests "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider -n 4 --timeout 200 ${TEST_K:+-k "$TEST_K"} ${TESTS:-tests/kernels}
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s26_gpu_tier${TAG:-}.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
for op in ${BENCH_OPS:-}; do
  stage "bench_$op" "${BENCH_S:-0}" tskernels-bench "$op" --graph --json "$OUT/s26_bench_$op.json"
done
for AB_BATCH in ${AB_BATCHES:-1}; do
for MODEL in ${AB_MODELS:-dummy:llama-3-8b}; do
  tag=${MODEL##*/}; tag=${tag%.json}; tag=${tag#dummy:}
  sv=AB_SETS_$AB_BATCH  # per batch size: AB_SETS_1, AB_SETS_8, ... (else AB_SETS)
  IFS='|' read -ra sets <<< "${!sv:-${AB_SETS:-}}"
  for v in "${sets[@]}"; do
    vtag=${v%%:*}
    stage "ab_${tag}_$vtag" "${AB_S:-0}" python benchmarks/serve_ab.py ${v#*:} -- --model "$MODEL" \
        --batch $AB_BATCH --new-tokens 48 --no-hf ${AB_EXTRA:-} --json "$OUT/s26_ab_${tag}_b${AB_BATCH}_$vtag.json"
  done
done
done
# the device returns ~8 files: everything goes back in one archive
cd "$OUT" && tar czf /tmp/s26_out.tgz * 2>/dev/null && rm -rf "$OUT"/* && mv /tmp/s26_out.tgz "$OUT/"; true
