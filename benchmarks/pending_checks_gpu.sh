#!/usr/bin/env bash
# Lab script: the GPU checks that earlier device calls never reached, in one call (carry .gpuwhl):
#   1. the block-fp8 fused-experts failure at T=300 (benchmarks/diag_moe_fp8.py, issue 24)
#   2. GPU tests never run on the H200: the one-launch greedy argmax under graph replay
#      (issue 23), overlap scheduling + sampling in the decode graphs (issue 20), the serving
#      CUDA graphs, the token-bitmask device test; then tests/kernels/test_moe_experts.py
#   3. STAGE2=moe: the Qwen3-30B-A3B-shaped agentic sweep (benchmarks/agentic_gpu.sh STAGE=moe)
# Stage limits: DIAG_S, TEST_S, MOE_S (seconds).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"

if [ "${DIAG_S:-90}" -gt 0 ]; then
  stamp "diag fp8 experts"
  timeout "${DIAG_S:-90}" python benchmarks/diag_moe_fp8.py --json "$OUT/diag_moe_fp8.json" 2>&1 \
      | grep -v -i warn | cut -c1-1500 | tail -12
fi
if [ "${TEST_S:-200}" -gt 0 ]; then
  stamp "gpu tests"
  export OMP_NUM_THREADS=1
  timeout "${TEST_S:-200}" python -m pytest -q -rfE -p no:cacheprovider -n 6 --timeout 180 \
      "tests/kernels/test_sampling_greedy_penalties.py::test_greedy_ticket_replays_in_cuda_graph" \
      "tests/serve/test_overlap.py::test_gpu_overlap_and_graph_sampling_equal" \
      tests/serve/test_cuda_graphs.py tests/serve/test_token_bitmask.py \
      tests/kernels/test_moe_experts.py > "$OUT/pending_gpu_tests.log" 2>&1
  echo "gpu tests rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pending_gpu_tests.log" | tail -12
fi
if [ "${MOE_S:-0}" -gt 0 ]; then
  stamp "agentic qwen3 moe"
  SETUP=0 STAGE=moe MOE_S=$MOE_S CONC=${CONC:-1,4,8} bash benchmarks/agentic_gpu.sh 2>&1 | tail -12
fi
stamp done
