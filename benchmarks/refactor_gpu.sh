#!/usr/bin/env bash
# Lab script: the GPU check of a refactor that must change neither results nor speed (issue 16):
#   1. the GPU tier of every refactored kernel (attention / MLA / kvcache / norm / rope /
#      activation backends, the conformance test, the serving CUDA graphs)
#      -> $OUT/gpu_tier_refactor_{attention,rest}.json
#   2. tskernels-bench decode / extend / MLA from the old and the new tree, alternating in the
#      same session (benchmarks/ab_bench.py) -> $OUT/ab_*.json and a new/old table.
# Before the device call (development machine), put the old tree in an ignored folder and carry it:
#   mkdir -p .cache/old && git archive 952d47b tskernels tskernels_ref autotune | tar -x -C .cache/old
# On the device, one stage per call (each fits one 10-minute call; STAGE=all runs them all):
#   STAGE=bench bash benchmarks/refactor_gpu.sh; STAGE=tier1 ...; STAGE=tier2 ...
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE=${STAGE:-all}

if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
  # before any editable install (ab_bench bypasses one anyway): each tree imports its own code
  timeout ${BENCH_TIMEOUT:-560} python benchmarks/ab_bench.py --old .cache/old --new . --out "$OUT" --rounds 1 \
    --op attention.decode:graph --op attention.extend:eager --op mla.decode:graph 2>&1 | tail -30
fi

install() {
  export TSKERNELS_TEST_SHARDS=15 OMP_NUM_THREADS=1
  pip install -q --no-index --no-deps --target /tmp/site $(ls .whl/*.whl .gpuwhl/*.whl 2>/dev/null) \
    && export PYTHONPATH=$PWD:/tmp/site
  python -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
}
P="--pytest-arg=-n --pytest-arg=15 --pytest-arg=-p --pytest-arg=no:cacheprovider --pytest-arg=--timeout=240"
K=tests/kernels

if [ "$STAGE" = tier1 ] || [ "$STAGE" = all ]; then  # paged attention
  install
  timeout ${TIER_TIMEOUT:-560} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-560} - 20 )) --out "$OUT/gpu_tier_refactor_attention.json" $P \
    --kernel attention.decode.triton=$K/test_attention_decode.py,$K/test_attention_graph.py \
    --kernel attention.decode.cuda=$K/test_attention_cuda.py \
    --kernel attention.extend.triton=$K/test_attention_extend.py \
    --kernel attention.extend.cuda=$K/test_attention_cuda_extend.py \
    --kernel attention.extend.cuda_paged=$K/test_attention_cuda_paged_extend.py \
    --kernel attention.store_kv.triton=$K/test_store_kv.py \
    --kernel attention.merge_states.triton=$K/test_merge_states.py \
    2>&1 | tail -30
fi

if [ "$STAGE" = tier2 ] || [ "$STAGE" = all ]; then  # MLA, kvcache, row ops, conformance, graphs
  install
  timeout ${TIER_TIMEOUT:-560} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-560} - 20 )) --out "$OUT/gpu_tier_refactor_rest.json" $P \
    --kernel mla.decode.triton=$K/test_mla.py \
    --kernel mla.extend.triton=$K/test_mla.py \
    --kernel mla.decode.cuda=$K/test_mla_cuda.py \
    --kernel kvcache.store_mla.triton=$K/test_store_mla.py \
    --kernel norm.rmsnorm.triton=$K/test_norm.py \
    --kernel norm.fused_add_rmsnorm.triton=$K/test_norm.py \
    --kernel rope.apply_rope.triton=$K/test_rope.py \
    --kernel activation.silu_and_mul.triton=$K/test_activation.py \
    --kernel conformance=tests/registry/test_conformance.py \
    --kernel serve.cuda_graphs=tests/serve/test_cuda_graphs.py \
    --kernel autotune.tuned_vs_heuristic=tests/autotune/test_tuning_gpu.py,tests/autotune/test_kernel_spaces.py,$K/test_attention_tuned.py \
    --kernel "gdn.launch_variants=$K/test_gdn.py::test_decode_block_widths|test_prefill_launch_variants" \
    2>&1 | tail -30
fi

if [ "$STAGE" = recheck ]; then  # what changed after its last GPU-tier run (session 11)
  install
  timeout ${TIER_TIMEOUT:-400} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-400} - 20 )) --out "$OUT/gpu_tier_recheck.json" $P \
    --kernel mla.decode.triton=$K/test_mla.py \
    --kernel mla.extend.triton=$K/test_mla.py \
    --kernel conformance=tests/registry/test_conformance.py \
    --kernel serve.cuda_graphs=tests/serve/test_cuda_graphs.py \
    --kernel "serve.grammar_mask=tests/serve/test_token_bitmask.py" \
    2>&1 | tail -30
fi

serving_setup() {  # the serve wheels, the tokenizer cache and the cp312 scheduler (.gpuwhl)
  pip install -q --no-index --no-deps --target /tmp/site $(ls .gpuwhl/*.whl) && export PYTHONPATH=$PWD:/tmp/site
  export TSKERNELS_CACHE=$PWD/.gpuwhl/tokcache
  cp .gpuwhl/sched312/_core*.so scheduler/ 2>/dev/null
  python -c "import scheduler._core" || python -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
}
# the serving tests and the MoE experts, first in both final stages
SERVING=(--kernel serve.overlap=tests/serve/test_overlap.py
         --kernel serve.cuda_graphs=tests/serve/test_cuda_graphs.py
         --kernel serve.grammar_mask=tests/serve/test_token_bitmask.py
         --kernel moe.fused_experts.triton=$K/test_moe_experts.py)

if [ "$STAGE" = final ]; then  # session 11's last call: serving (overlap, graph sampling), conformance, MoE experts
  serving_setup
  timeout ${TIER_TIMEOUT:-230} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-230} - 15 )) --out "$OUT/gpu_tier_final.json" $P \
    "${SERVING[@]}" \
    --kernel conformance=tests/registry/test_conformance.py \
    2>&1 | tail -25
fi

if [ "$STAGE" = final12 ]; then  # session 12: what changed since its last GPU tier, serving first
  serving_setup
  timeout ${TIER_TIMEOUT:-420} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-420} - 15 )) --out "$OUT/gpu_tier_s12.json" $P \
    "${SERVING[@]}" \
    --kernel sampling.triton=$K/test_sampling.py,$K/test_sampling_greedy_penalties.py \
    --kernel gdn.triton=$K/test_gdn.py,$K/test_gdn_conv.py \
    --kernel attention.decode.triton=$K/test_attention_decode.py \
    --kernel mla.triton=$K/test_mla.py \
    --kernel conformance=tests/registry/test_conformance.py \
    2>&1 | tail -25
fi

if [ "$STAGE" = final12b ]; then  # session 12: the sampling / MLA / GDN kernels by name
  pip install -q --no-index --no-deps --target /tmp/site $(ls .gpuwhl/*.whl) && export PYTHONPATH=$PWD:/tmp/site
  S=$K/test_sampling.py,$K/test_sampling_greedy_penalties.py
  timeout ${TIER_TIMEOUT:-200} python benchmarks/gpu_tier.py --timeout $(( ${TIER_TIMEOUT:-200} - 15 )) --out "$OUT/gpu_tier_s12b.json" $P \
    --kernel sampling.sample.triton=$S --kernel sampling.greedy.triton=$S \
    --kernel sampling.apply_penalties.triton=$S \
    --kernel mla.decode.triton=$K/test_mla.py --kernel mla.extend.triton=$K/test_mla.py \
    --kernel gdn.chunk_prefill.triton=$K/test_gdn.py --kernel gdn.decode_step.triton=$K/test_gdn.py \
    --kernel gdn.gate.triton=$K/test_gdn.py --kernel gdn.causal_conv1d.triton=$K/test_gdn_conv.py \
    --kernel gdn.causal_conv1d_update.triton=$K/test_gdn_conv.py \
    2>&1 | tail -16
fi
