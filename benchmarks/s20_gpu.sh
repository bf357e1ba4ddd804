#!/usr/bin/env bash
# Lab script: session 20's H200 calls (carry .gpuwhl and .whl, made by
# benchmarks/prepare_carry.sh; session 20 ran it from a git archive of the
# committed tree). Stages by their time limits in seconds (0 or unset skips); each stage's log
# goes to $OUT/s20_<stage>.log and everything returns as $OUT/s20_${PACK:-call}.tgz:
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs (hypothesis
#             profile ci, -n 8) -> s20_gpu_tier${TAG}.json
#   GDN_S:    benchmarks/s15_gdn_gpu.py with GDN_OLD / GDN_NEW / GDN_TESTS from the environment
#             (tag s20): the GDN prefill variants vs the default and FLA 0.6.0 (wheels in .whl)
#   SAMPLE_S: benchmarks/sampling_gpu.py $OUT ${SAMPLE_ARGS:-bench} (the tskernels-bench cases)
#   MOET_S:   benchmarks/s21_moe_direct_tiles_gpu.py (session 21: the decode MoE's tile shapes)
#   TEST_S / TESTS: a pytest -m gpu run over TESTS
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
FINAL_OUT=$OUT; OUT=$OUT/raw; mkdir -p "$OUT"
STAGE_PREFIX=s20  # stage (gpu_setup.sh) logs to $OUT/s20_NAME.log
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier${TAG:-} "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s20_gpu_tier${TAG:-}.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
TAIL=40 stage gdn "${GDN_S:-0}" env GDN_TAG=s20 python benchmarks/s15_gdn_gpu.py "$OUT" \
    $(( ${GDN_S:-0} - 10 ))
stage sample "${SAMPLE_S:-0}" python benchmarks/sampling_gpu.py "$OUT" ${SAMPLE_ARGS:-bench}
TAIL=50 stage moetiles "${MOET_S:-0}" python benchmarks/s21_moe_direct_tiles_gpu.py "$OUT" \
    $(( ${MOET_S:-0} - 10 ))
stage tests "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider -n 4 --timeout 200 ${TESTS:-tests/kernels}
stamp done
( cd "$OUT" && tar czf "$FINAL_OUT/s20_${PACK:-call}.tgz" . ) && rm -rf "$OUT"
