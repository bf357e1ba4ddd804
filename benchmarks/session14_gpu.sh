#!/usr/bin/env bash
# Lab script: session 14's H200 calls (carry .gpuwhl). Stages by their time limits (0 skips):
#   TEST_S: GPU tests never run since their code changed: the serving CUDA graphs after the
#     CudaGraphs hook refactor (tests/serve/test_cuda_graphs.py), the overlap / in-graph
#     sampling test, the one-launch argmax graph replays
#   I23_S: benchmarks/issue23_third_gpu.py (greedy loop_ticket sweep, sampler kernel profile);
#   I23_OLD_S: the same from the tree in .cache/old (carry it: git archive <commit> tskernels
#     tskernels_ref autotune | tar -x -C .cache/old)
#   TIER_S: benchmarks/gpu_tier.py over the sampling tests (hypothesis profile ci)
#   TESTS / PYTEST_N / TAG: override the test list, xdist and the log's name
#   LLAMA_S: dense Llama-3-8B dummy, B=1 decode through CUDA graphs (serve_gpu_bench.py)
#   PROBE_S: benchmarks/ttft_profile_probe.py (where the later turn and the 51k decode go)
#   GAP_S: the B=64 host gap, overlap on / off / lookahead (benchmarks/agentic_engine_bench.py)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
if [ "${TEST_S:-0}" -gt 0 ]; then
  stamp "gpu tests"
  OMP_NUM_THREADS=1 timeout "$TEST_S" python -m pytest -m gpu -q -rfE -p no:cacheprovider ${PYTEST_N:--n 6} --timeout 200 \
      ${TESTS:-tests/serve/test_cuda_graphs.py tests/serve/test_overlap.py \
      tests/kernels/test_sampling_greedy_penalties.py::test_greedy_ticket_replays_in_cuda_graph} \
      > "$OUT/s14_gpu_tests${TAG:-}.log" 2>&1
  echo "gpu tests rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/s14_gpu_tests.log" | tail -12
fi
if [ "${TIER_S:-0}" -gt 0 ]; then   # the sampling GPU tier as evidence (verified.json)
  stamp "sampling gpu tier"
  OMP_NUM_THREADS=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} timeout "$TIER_S" python benchmarks/gpu_tier.py \
      --timeout $(( TIER_S - 15 )) --out "$OUT/s14_sampling_gpu_tier.json" --pytest-arg=-n --pytest-arg=8 \
      --kernel sampling.sample.triton=tests/kernels/test_sampling.py \
      --kernel sampling.greedy.triton=tests/kernels/test_sampling_greedy_penalties.py 2>&1 | tail -6
fi
if [ "${I23_S:-0}" -gt 0 ]; then
  stamp "issue 23 third"
  timeout "$I23_S" python benchmarks/issue23_third_gpu.py "$OUT" $(( I23_S - 15 )) ${I23_STAGES:-greedy sample} 2>&1 \
      | grep -v -i warn | cut -c1-700 | tail -14
fi
if [ "${I23_OLD_S:-0}" -gt 0 ]; then   # the same stages from the tree in .cache/old
  stamp "issue 23 third, old tree"
  mkdir -p "$OUT/old"
  PYTHONPATH=$PWD/.cache/old:$PYTHONPATH timeout "$I23_OLD_S" python benchmarks/issue23_third_gpu.py "$OUT/old" \
      $(( I23_OLD_S - 15 )) ${I23_STAGES:-greedy sample} 2>&1 | grep -v -i warn | cut -c1-700 | tail -8
fi
if [ "${LLAMA_S:-0}" -gt 0 ]; then
  stamp "llama B=1"
  timeout "$LLAMA_S" python benchmarks/serve_gpu_bench.py --model dummy:llama-3-8b --batch 1 \
      --new-tokens 48 --no-hf --json "$OUT/s14_serve_llama_b1.json" 2>&1 | grep -v -i warn | tail -6
fi
if [ "${GAP_S:-0}" -gt 0 ]; then
  stamp "host gap B=64"
  timeout "$GAP_S" python benchmarks/agentic_engine_bench.py --model dummy:benchmarks/configs/llama-3-8b-64k.json \
      --skip-conc1 --gap-steps 100 ${GAP_ARGS:-} --json "$OUT/s14_gap_llama8b.json" 2>&1 | grep -v -i warn | tail -8
fi
if [ "${PROBE_S:-0}" -gt 0 ]; then
  stamp "later-turn TTFT / long-context decode profile"
  timeout "$PROBE_S" python benchmarks/ttft_profile_probe.py --model dummy:benchmarks/configs/llama-3-8b-64k.json \
      --json "$OUT/s14_ttft_profile.json" 2>&1 | grep -v -i warn | grep -v USDT | cut -c1-900 | tail -8
fi
stamp done
