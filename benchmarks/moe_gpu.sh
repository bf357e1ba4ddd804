#!/bin/bash
# The MoE GPU session in one device call (~4 minutes): GPU tier of the moe Triton kernels
# (xdist over the cores: the time goes to Triton JIT compiles), the layer benchmark vs vLLM's
# Triton fused-MoE / torch._grouped_mm / the per-expert loop, and the Qwen3-30B-A3B-shaped
# dummy decode at B=1 through CUDA graphs. Results under $OUT. Carry .whl (vLLM kernel copy).
#   bash benchmarks/moe_gpu.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# the scheduler extension (serving needs it), built beside the GPU tier
( python -c "import scheduler._core" 2>/dev/null || { cmake -S . -B /tmp/ext \
    -DPython_EXECUTABLE="$(which python)" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build /tmp/ext -j 6 >/dev/null && cp /tmp/ext/_core*.so scheduler/; } ) \
  > /tmp/ext.log 2>&1 &
BUILD=$!
R=tests/kernels/test_moe_routing.py; X=tests/kernels/test_moe_experts.py
OMP_NUM_THREADS=1 timeout ${TIER_S:-80} python benchmarks/gpu_tier.py --out $OUT/moe_gpu_tier.json \
  --timeout $(( ${TIER_S:-80} - 5 )) --pytest-arg=-n --pytest-arg=10 --pytest-arg=-p \
  --pytest-arg=no:cacheprovider \
  --kernel moe.topk_softmax.triton=$R --kernel moe.topk_sigmoid_grouped.triton=$R \
  --kernel moe.align_by_expert.triton=$R --kernel moe.fused_experts.triton=$X \
  --kernel moe.combine.triton=$X 2>&1 | tail -12
timeout ${BENCH_S:-85} python benchmarks/moe_gpu.py --out $OUT 2>&1 | grep -v Warn | tail -16
wait $BUILD; tail -3 /tmp/ext.log
MOE=moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton
TSKERNELS_BACKEND=$MOE timeout ${SERVE_S:-75} python benchmarks/serve_gpu_bench.py \
  --model dummy:benchmarks/configs/qwen3-30b-a3b.json --no-hf --batch 1 --new-tokens 32 \
  --json $OUT/moe_serve_qwen3_30b_a3b.json 2>&1 | grep -v -i warn | tail -6
