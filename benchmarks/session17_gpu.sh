#!/usr/bin/env bash
# Lab script: session 17's H200 calls (carry .gpuwhl; run from a git archive of the committed
# tree). Stages by their time limits in seconds (0 or unset skips); each stage's log goes to
# $OUT/s17_<stage>.log:
#   FP8S_S:   benchmarks/s17_fp8_small_gpu.py (block-fp8 at M = 1 / 16 / 64: L2-prefetching
#             PDL launches, programs per SM, the CUDA kernel at M = 64, cuBLAS)
#   ROPE_S:   benchmarks/s17_rope_store_gpu.py (fused q/k-norm + RoPE + KV store vs the
#             separate launches)
#   MLA_S:    benchmarks/s17_mla_sync_gpu.py (the MLA extend plan from host copies: no sync)
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs (hypothesis
#             profile ci, -n 8) -> $OUT/s17_gpu_tier.json
#   AB_S / AB_RUNS: B=1 decode through serve_ab, one engine process per AB_RUNS entry
#             ("tag|model|--set switches", ';'-separated), each under AB_S
#   AGENTIC_S: benchmarks/agentic_engine_bench.py (later-turn TTFT x 5, B=1 ITL at ~53k, host
#             gap with lookahead) on the dummy Llama-3-8B 64k config
#   TEST_S / TESTS / PYTEST_N / TAG: a pytest -m gpu run over TESTS
#   MOE_S:    benchmarks/s18_moe_pdl_gpu.py (session 18: the decode MoE layer chained)
#   AB_BATCH / AB_TOKENS: serve_ab's --batch / --new-tokens (default 1 / 48); AB_EXTRA: more
#             serve_gpu_bench arguments (e.g. --profile)
#   BAL_S:    benchmarks/s19_balance_gpu.py (session 19: the paged extend's balanced split)
#   PACK:     the name of the archive the stages' outputs go back in ($OUT/s17_$PACK.tgz)
# (written for session 17; sessions 18 and 19 added stages)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
# the device returns at most 8 files (the first 8 by name): the stages write under $OUT/raw,
# which goes back as one archive at the end
FINAL_OUT=$OUT; OUT=$OUT/raw; mkdir -p "$OUT"
STAGE_PREFIX=s17  # stage (gpu_setup.sh) logs to $OUT/s17_NAME.log
stage fp8small "${FP8S_S:-0}" python benchmarks/s17_fp8_small_gpu.py "$OUT" $(( ${FP8S_S:-0} - 10 ))
stage moe "${MOE_S:-0}" python benchmarks/s18_moe_pdl_gpu.py "$OUT" $(( ${MOE_S:-0} - 10 ))
stage balance "${BAL_S:-0}" python benchmarks/s19_balance_gpu.py "$OUT" $(( ${BAL_S:-0} - 10 ))
stage mla "${MLA_S:-0}" python benchmarks/s17_mla_sync_gpu.py "$OUT"
stage rope "${ROPE_S:-0}" python benchmarks/s17_rope_store_gpu.py "$OUT" $(( ${ROPE_S:-0} - 10 ))
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s17_gpu_tier.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
# AB_RUNS: "tag|model|--set switches" entries separated by ';' (serve_ab, one process each)
IFS=';' read -ra runs <<< "${AB_RUNS:-}"
for r in "${runs[@]}"; do
  IFS='|' read -r tag m sets <<< "$r"
  [ -n "$tag" ] || continue
  stage ab_$tag "${AB_S:-0}" python benchmarks/serve_ab.py $sets -- --model "$m" \
      --batch "${AB_BATCH:-1}" --new-tokens "${AB_TOKENS:-48}" --no-hf ${AB_EXTRA:-} \
      --json "$OUT/s17_ab_$tag.json"
done
stage agentic "${AGENTIC_S:-0}" python benchmarks/agentic_engine_bench.py \
    --model dummy:benchmarks/configs/llama-3-8b-64k.json --later-turns 5 --gap-modes lookahead \
    --gap-steps 30 --json "$OUT/s17_agentic_engine.json"
stage tests${TAG:-} "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider ${PYTEST_N:--n 4} --timeout 200 ${TESTS:-tests/kernels}
stamp done
( cd "$OUT" && tar czf "$FINAL_OUT/s17_${PACK:-call}.tgz" . ) && rm -rf "$OUT"
