#!/usr/bin/env bash
# Lab script: session 16's H200 calls (carry .gpuwhl; run from a git archive of the committed
# tree). Stages by their time limits in seconds (0 or unset skips); each stage's log goes to
# $OUT/s16_<stage>.log:
#   FP8_S:    GPU tests of the CUDA block-fp8 GEMM, then benchmarks/s16_fp8_gpu.py (vs cuBLAS)
#   DEC_S:    benchmarks/s16_decode_gpu.py (PDL-chained decode launches, gemv L2 prefetch, B=1)
#   GREEDY_S: benchmarks/s16_greedy_gpu.py (greedy argmax variants vs torch.argmax)
#   TTFT_S:   benchmarks/s16_ttft_gpu.py (later-turn TTFT, agentic bench vs probe)
#   TEST_S / TESTS / PYTEST_N / TAG: a pytest -m gpu run over TESTS
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
stage() {  # stage NAME LIMIT CMD...: run CMD under timeout LIMIT, log to $OUT/s16_NAME.log
  local name=$1 limit=$2; shift 2
  [ "${limit:-0}" -gt 0 ] || return 0
  stamp "$name (limit $limit s)"
  timeout -k 5 "$limit" "$@" > "$OUT/s16_$name.log" 2>&1
  echo "$name rc $?"; grep -v -i "warn\|USDT" "$OUT/s16_$name.log" | cut -c1-300 | tail -${TAIL:-14}
}
stage fp8tests "${FP8_S:-0}" python -m pytest -q -m gpu -p no:cacheprovider --timeout 60 -rfE \
    tests/kernels/test_gemm_cuda_fp8.py
stage fp8 "${FP8_S:-0}" python benchmarks/s16_fp8_gpu.py "$OUT" $(( ${FP8_S:-0} - 30 )) ${FP8_M:-4096}
stage decode "${DEC_S:-0}" python benchmarks/s16_decode_gpu.py "$OUT" $(( ${DEC_S:-0} - 10 ))
stage greedy "${GREEDY_S:-0}" python benchmarks/s16_greedy_gpu.py "$OUT" $(( ${GREEDY_S:-0} - 10 ))
stage ttft "${TTFT_S:-0}" python benchmarks/s16_ttft_gpu.py "$OUT" $(( ${TTFT_S:-0} - 10 ))
stage tests${TAG:-} "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider ${PYTEST_N:--n 4} --timeout 200 ${TESTS:-tests/kernels}
stamp done
