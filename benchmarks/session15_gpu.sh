#!/usr/bin/env bash
# Lab script: session 15's H200 calls (carry .gpuwhl and .whl). Stages by their time limits in
# seconds (0 or unset skips); each stage's log goes to $OUT/s15_<stage>.log:
#   EXT_S:    benchmarks/s15_extend_gpu.py (split-KV paged extend: GPU tests, old vs new)
#   GDN_S:    benchmarks/s15_gdn_gpu.py (GDN chunk prefill: GPU tests, old vs new vs FLA 0.6.0)
#   GEMV_S:   benchmarks/s15_gemv_gpu.py (norm / SiLU-mul prologue gemvs: tests, kernels, B=1)
#   SPLITS_S: benchmarks/s15_decode_splits.py (B=1 decode attention over 51.7k / 16k keys)
#   PROBE_S:  benchmarks/ttft_profile_probe.py (later turn 50.8k cached + 800 new; 51.7k decode)
#   TEST_S / TESTS / PYTEST_N / TAG: a pytest -m gpu run over TESTS
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
stage() {  # stage NAME LIMIT CMD...: run CMD under timeout LIMIT, log to $OUT/s15_NAME.log
  local name=$1 limit=$2; shift 2
  [ "${limit:-0}" -gt 0 ] || return 0
  stamp "$name (limit $limit s)"
  timeout "$limit" "$@" > "$OUT/s15_$name.log" 2>&1
  echo "$name rc $?"; grep -v -i "warn\|USDT" "$OUT/s15_$name.log" | cut -c1-400 | tail -${TAIL:-16}
}
stage ext "${EXT_S:-0}" python benchmarks/s15_extend_gpu.py "$OUT" $(( ${EXT_S:-0} - 10 ))
stage gdn "${GDN_S:-0}" python benchmarks/s15_gdn_gpu.py "$OUT" $(( ${GDN_S:-0} - 10 ))
stage gemv "${GEMV_S:-0}" python benchmarks/s15_gemv_gpu.py "$OUT" $(( ${GEMV_S:-0} - 10 ))
stage splits "${SPLITS_S:-0}" python benchmarks/s15_decode_splits.py "$OUT"
stage probe "${PROBE_S:-0}" python benchmarks/ttft_profile_probe.py \
    --model dummy:benchmarks/configs/llama-3-8b-64k.json --json "$OUT/s15_ttft_profile.json"
stage tests${TAG:-} "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider ${PYTEST_N:--n 4} --timeout 200 ${TESTS:-tests/kernels}
stamp done
