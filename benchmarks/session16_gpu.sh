#!/usr/bin/env bash
# Lab script: session 16's H200 calls (carry .gpuwhl; run from a git archive of the committed
# tree). Stages by their time limits in seconds (0 or unset skips); each stage's log goes to
# $OUT/s16_<stage>.log:
#   FP8_S:    GPU tests of the CUDA block-fp8 GEMM, then benchmarks/s16_fp8_gpu.py (vs cuBLAS)
#   DEC_S:    benchmarks/s16_decode_gpu.py (PDL-chained decode launches, gemv L2 prefetch, B=1)
#   GREEDY_S: benchmarks/s16_greedy_gpu.py (greedy argmax variants vs torch.argmax)
#   TTFT_S:   benchmarks/s16_ttft_gpu.py (later-turn TTFT, agentic bench vs probe)
#   TIER_S:   benchmarks/gpu_tier.py over the kernels whose code or default changed this session
#             (hypothesis profile ci, -n 8) -> $OUT/s16_gpu_tier.json
#   AB_S:     dummy Llama-3-8B B=1 decode, old launches (no chain / prefetch / one-launch RoPE)
#             vs the new defaults, one engine process each (benchmarks/serve_ab.py)
#   AGENTIC_S: benchmarks/agentic_engine_bench.py (later-turn TTFT x 5, B=1 ITL at ~53k, host
#             gap with lookahead) on the dummy Llama-3-8B 64k config
#   TEST_S / TESTS / PYTEST_N / TAG: a pytest -m gpu run over TESTS
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
STAGE_PREFIX=s16  # stage (gpu_setup.sh) logs to $OUT/s16_NAME.log
stage fp8tests "${FP8_S:-0}" python benchmarks/gpu_tier.py --out "$OUT/s16_fp8_tier.json" \
    --pytest-arg=-n --pytest-arg=4 --pytest-arg=-p --pytest-arg=no:cacheprovider \
    --kernel gemm.fp8_block_mm.cuda_sm90=tests/kernels/test_gemm_cuda_fp8.py
stage fp8 "${FP8_S:-0}" python benchmarks/s16_fp8_gpu.py "$OUT" $(( ${FP8_S:-0} - 30 )) ${FP8_M:-4096}
K=tests/kernels
stage tier "${TIER_S:-0}" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
    --out "$OUT/s16_gpu_tier.json" --timeout $(( ${TIER_S:-0} - 15 )) \
    --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider \
    --kernel gemm.fp8_block_mm.cuda_sm90=$K/test_gemm_cuda_fp8.py \
    --kernel sampling.greedy.triton=$K/test_sampling_greedy_penalties.py \
    --kernel norm.rmsnorm.triton=$K/test_norm.py --kernel norm.fused_add_rmsnorm.triton=$K/test_norm.py \
    --kernel rope.apply_rope.triton=$K/test_rope.py \
    --kernel activation.silu_and_mul.triton=$K/test_activation.py \
    --kernel attention.store_kv.triton=$K/test_store_kv.py \
    --kernel gemm.gemv.triton=$K/test_gemm_triton.py \
    --kernel attention.decode.triton=$K/test_attention_decode.py
OLD="--set tskernels.ops.shared.pdl.CHAIN=set() --set tskernels.ops.gemm.triton_gemv.PREFETCH_TILES=0 --set tskernels.ops.rope.triton.ONE_LAUNCH=False"
for v in old new new2; do
  sets=""; [ "$v" = old ] && sets="$OLD"
  stage ab_$v "${AB_S:-0}" python benchmarks/serve_ab.py $sets -- --model dummy:llama-3-8b \
      --batch 1 --new-tokens 48 --no-hf --json "$OUT/s16_ab_$v.json"
done
stage decode "${DEC_S:-0}" python benchmarks/s16_decode_gpu.py "$OUT" $(( ${DEC_S:-0} - 10 ))
stage greedy "${GREEDY_S:-0}" python benchmarks/s16_greedy_gpu.py "$OUT" $(( ${GREEDY_S:-0} - 10 ))
stage ttft "${TTFT_S:-0}" python benchmarks/s16_ttft_gpu.py "$OUT" $(( ${TTFT_S:-0} - 10 ))
stage agentic "${AGENTIC_S:-0}" python benchmarks/agentic_engine_bench.py \
    --model dummy:benchmarks/configs/llama-3-8b-64k.json --later-turns 5 --gap-modes lookahead \
    --gap-steps 30 --json "$OUT/s16_agentic_engine.json"
stage tests${TAG:-} "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider ${PYTEST_N:--n 4} --timeout 200 ${TESTS:-tests/kernels}
stamp done
# the device returns at most 8 files: everything goes back as one archive (+ the summary JSONs)
( cd "$OUT" && tar czf "s16_${PACK:-call}.tgz" --exclude='*.tgz' . )
