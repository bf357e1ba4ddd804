# Session 24 device stages. Each stage runs under its own limit; 0 (the default) skips it.
#   GEMV_S: benchmarks/s24_gemv_gpu.py (decode GEMVs: split kernel vs rows / no-split, fp8 M=1)
#   BENCH_S: tskernels-bench gemm.gemv --graph (its shapes, cuBLAS beside it, the roofline)
#   TEST_S / TESTS: a pytest -m gpu run over TESTS
#   HEUR_S: benchmarks/s24_heuristics_gpu.py (gemm.mm big vs small tile at M 160-512, rmsnorm
#           warps x rows for short rows)
#   AGENTIC_S: benchmarks/agentic_engine_bench.py (issue 20: later-turn TTFT, B=1 ITL at ~54k)
#   MOE_S:  benchmarks/s24_moe_rows_gpu.py (the decode MoE layer: tensor-core vs rows experts;
#           needs the tree of f4288e7, where the rows experts exist)
#   AB_S / AB_PAIRS / AB_MODEL / AB_OLD: serve_ab.py at B = 1, the shipped launches vs the
#           session-23 ones (AB_OLD: the --set switches naming them), alternated AB_PAIRS times
#   AB_SETS: further engines run once each after the pairs, "tag:--set a=b --set c=d|tag2:..."
#   AB_HF=1: HF generate beside the first new engine (serve_gpu_bench without --no-hf)
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs -> s24_gpu_tier.json
#   EXT_S: autotune's extend tuning runner at N = 16384 (its row-block float64 reference)
source benchmarks/gpu_setup.sh
stage bench "${BENCH_S:-0}" tskernels-bench gemm.gemv --graph --json "$OUT/s24_bench_gemv.json"
TAIL=30 stage tests "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider -n 4 --timeout 200 ${TESTS:-tests/kernels}
TAIL=40 stage heur "${HEUR_S:-0}" python benchmarks/s24_heuristics_gpu.py "$OUT"
stage agentic "${AGENTIC_S:-0}" python benchmarks/agentic_engine_bench.py \
    --model dummy:benchmarks/configs/llama-3-8b-64k.json --later-turns 5 --gap-modes lookahead \
    --gap-steps 30 --json "$OUT/s24_agentic_engine.json"
stage moe "${MOE_S:-0}" python benchmarks/s24_moe_rows_gpu.py "$OUT"
stage gemv "${GEMV_S:-0}" python benchmarks/s24_gemv_gpu.py "$OUT" $(( ${GEMV_S:-0} - 40 ))
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s24_gpu_tier${TAG:-}.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
AB_OLD=${AB_OLD:-"--set tskernels.ops.gemm.triton_gemv.ROWS_M1=None"}
MODEL=${AB_MODEL:-dummy:llama-3-8b}; tag=${MODEL##*/}; tag=${tag%.json}; tag=${tag#dummy:}
stage extend "${EXT_S:-0}" python -m autotune --user-dir /tmp/at tune attention.extend \
    --shapes d=128,g=4,q=bf16,kv=bf16,causal=1,N=16384,P=0 --limit 4 --force \
    --json "$OUT/s24_extend_tune.json"
for i in $(seq 1 "${AB_PAIRS:-1}"); do
  hf=--no-hf; [ "$i" = 1 ] && [ "${AB_HF:-0}" = 1 ] && hf=
  stage "ab_${tag}_new$i" "${AB_S:-0}" python benchmarks/serve_ab.py -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 $hf --json "$OUT/s24_ab_${tag}_new$i.json"
  stage "ab_${tag}_old$i" "${AB_S:-0}" python benchmarks/serve_ab.py $AB_OLD -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 --no-hf --json "$OUT/s24_ab_${tag}_old$i.json"
done
IFS='|' read -ra sets <<< "${AB_SETS:-}"
for v in "${sets[@]}"; do
  vtag=${v%%:*}
  stage "ab_${tag}_$vtag" "${AB_S:-0}" python benchmarks/serve_ab.py ${v#*:} -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 --no-hf --json "$OUT/s24_ab_${tag}_$vtag.json"
done
