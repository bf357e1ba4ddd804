#!/bin/bash
# Issue 24's decode-path device call (~4.5 minutes): GPU tier of the changed gemm / moe kernels,
# old vs new kernel timings (benchmarks/gemm_decode_ab.py, the moe layer with the aligned path
# and vLLM's Triton fused-MoE beside ours), then the dummy Llama-3-8B B=1 decode step with and
# without PDL gemvs and the Qwen3-30B-A3B-shaped one, through CUDA graphs. Runs from a clean
# `git archive` of the commit under test in $SRC (default: the current directory); JSON to $OUT.
#   SRC=.cache/i24 bash benchmarks/gemm_moe_decode_gpu.sh
export PYTHONUNBUFFERED=1
ROOT=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cd "${SRC:-.}" || exit 1
export PYTHONPATH=$PWD VLLM_MOE_DIR=${VLLM_MOE_DIR:-$ROOT/.whl/vllm_moe}
( python -c "import scheduler._core" 2>/dev/null || { cmake -S . -B /tmp/ext \
    -DPython_EXECUTABLE="$(which python)" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build /tmp/ext -j 8 >/dev/null && cp /tmp/ext/_core*.so scheduler/; } ) \
  > /tmp/ext.log 2>&1 &
BUILD=$!
G=tests/kernels/test_gemm_triton.py; R=tests/kernels/test_moe_routing.py
X=tests/kernels/test_moe_experts.py
OMP_NUM_THREADS=1 timeout ${TIER_S:-55} python benchmarks/gpu_tier.py \
  --out $OUT/gpu_tier_i24_decode.json --timeout $(( ${TIER_S:-55} - 4 )) \
  --pytest-arg=-n --pytest-arg=12 --pytest-arg=-p --pytest-arg=no:cacheprovider \
  --kernel gemm.gemv.triton=$G --kernel gemm.fp8_block_mm.triton=$G \
  --kernel gemm.mm.triton=$G --kernel moe.topk_softmax.triton=$R \
  --kernel moe.topk_sigmoid_grouped.triton=$R --kernel moe.fused_experts.triton=$X \
  --kernel moe.combine.triton=$X 2>&1 | tail -6
timeout ${GEMV_S:-30} python benchmarks/gemm_decode_ab.py --out $OUT --stages gemv 2>&1 \
  | grep -v -i warn
# the gemv sweep's per-shape winners (>= 2 % faster than the shipped choice), for serve run 2
TABLE=$(python -c "
import json, sys
t = {}
for r in json.load(open('$OUT/i24_gemv.json'))['rows']:
    s, b = r['shape'], r['best_sweep']
    if s['M'] == 1 and b['us'] < 0.98 * r['pdl_on_us']:
        t[(s['N'], s['K'])] = (b['config'], b['programs_per_sm'])
print(repr(t))" 2>/dev/null || echo "{}")
echo "per-shape table: $TABLE"
wait $BUILD; tail -2 /tmp/ext.log
S="python benchmarks/serve_ab.py"
timeout ${SERVE1_S:-50} $S -- --batch 1 --new-tokens 48 --no-hf --profile \
  --json $OUT/i24_serve_llama_pdl.json 2>&1 | grep -E "^engine|^switches|_kernel|ms " | head -14
timeout ${SERVE2_S:-28} $S --set "tskernels.ops.gemm.triton_gemv.SHAPE_CONFIGS=$TABLE" -- \
  --batch 1 --new-tokens 48 --no-hf --json $OUT/i24_serve_llama_table.json 2>&1 \
  | grep -E "^engine|^sw"
timeout ${SERVE2_S:-28} $S --set tskernels.ops.gemm.triton_gemv.USE_PDL=False -- --batch 1 \
  --new-tokens 48 --no-hf --json $OUT/i24_serve_llama_nopdl.json 2>&1 | grep -E "^engine|^sw"
timeout ${QWEN_S:-42} $S -- --model dummy:benchmarks/configs/qwen3-30b-a3b.json --no-hf \
  --batch 1 --new-tokens 32 --profile --json $OUT/i24_serve_qwen3.json 2>&1 \
  | grep -E "^engine|^switches|ms " | head -14
timeout ${AB_S:-52} python benchmarks/gemm_decode_ab.py --out $OUT --stages moe,fp8 2>&1 \
  | grep -v -i warn
