#!/bin/bash
# Second MoE device call: per-kernel profile of the layer (T=1, 8192) and the block-fp8
# Qwen3-30B-A3B-shaped dummy decode at B=1 through CUDA graphs.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
( python -c "import scheduler._core" 2>/dev/null || { cmake -S . -B /tmp/ext \
    -DPython_EXECUTABLE="$(which python)" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build /tmp/ext -j 12 >/dev/null && cp /tmp/ext/_core*.so scheduler/; } ) \
  > /tmp/ext.log 2>&1 &
BUILD=$!
timeout 45 python benchmarks/moe_profile.py --json $OUT/moe_profile.json 2>&1 | grep -v Warn | tail -20
wait $BUILD
MOE=moe.topk_softmax=triton,moe.align_by_expert=triton,moe.fused_experts=triton
TSKERNELS_BACKEND=$MOE timeout 80 python benchmarks/serve_gpu_bench.py \
  --model dummy:benchmarks/configs/qwen3-30b-a3b-fp8.json --no-hf --batch 1 --new-tokens 32 \
  --json $OUT/moe_serve_qwen3_30b_a3b_fp8.json 2>&1 | grep -v -i warn | tail -6
