#!/usr/bin/env bash
# Lab script (session 23): after the MoE lookup regression, re-run tskernels-bench's default
# shapes of the main ops under CUDA-graph replay with their torch / cuBLAS baselines in the same
# run (one op per stage, each under its own time limit), to compare with the recorded figures
# (benchmarks/s23_regression_compare.py). JSON per op in $OUT/sweep/.
source benchmarks/gpu_setup.sh >/dev/null 2>&1
mkdir -p "$OUT/sweep"
run() {  # op limit baselines
  local t0=$(date +%s)
  timeout -k 5 "$2" python -m tskernels.bench.cli "$1" --graph --compare "$3" --json "$OUT/sweep/$1.json" \
      > "$OUT/sweep/$1.log" 2>&1
  echo "$1 rc $? $(( $(date +%s) - t0 )) s"
}
run norm.rmsnorm 40 torch_eager
run norm.fused_add_rmsnorm 40 torch_eager
run rope.apply_rope 40 torch_eager
run activation.silu_and_mul 40 torch_eager
run attention.store_kv 40 torch_index_put
run gemm.gemv 50 cublas
run gemm.mm 60 cublas
run gemm.fp8_block_mm 50 cublas_blockwise
run attention.decode 60 torch_sdpa_contiguous
run attention.extend 60 torch_sdpa_contiguous
run mla.decode 50 torch_bmm
run sampling.greedy 40 torch_argmax
run sampling.sample 50 torch_topk_first
run gdn.decode_step 40 none
