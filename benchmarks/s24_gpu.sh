# Session 24 device stages. Each stage runs under its own limit; 0 (the default) skips it.
#   GEMV_S: benchmarks/s24_gemv_gpu.py (GEMV_MODE=few: M = 1 / 2 / 4 with the rows kernel's
#           2-4 row form) (decode GEMVs: split kernel vs rows / no-split, fp8 M=1)
#   BENCH_S: tskernels-bench gemm.gemv --graph (its shapes, cuBLAS beside it, the roofline)
#   TEST_S / TESTS: a pytest -m gpu run over TESTS
#   HEUR_S: benchmarks/s24_heuristics_gpu.py (gemm.mm big vs small tile at M 160-512, rmsnorm
#           warps x rows for short rows)
#   AGENTIC_S: benchmarks/agentic_engine_bench.py (issue 20: later-turn TTFT, B=1 ITL at ~54k)
#   MOE_S:  benchmarks/s24_moe_rows_gpu.py (the decode MoE layer: tensor-core vs rows experts;
#           needs the tree of f4288e7, where the rows experts exist)
#   AB_S / AB_PAIRS / AB_MODEL / AB_OLD: serve_ab.py at B = 1, the shipped launches vs the
#           session-23 ones (AB_OLD: the --set switches naming them), alternated AB_PAIRS times
#   AB_SETS: further engines run once each after the pairs, "tag:--set a=b --set c=d|tag2:..."
#   AB_HF=1: HF generate beside the first new engine (serve_gpu_bench without --no-hf)
#   TIER_S / TIER_KERNELS: benchmarks/gpu_tier.py over "kernel=test_file" pairs -> s24_gpu_tier.json
#   EXT_S: autotune's extend tuning runner at N = 16384 (its row-block float64 reference)
source benchmarks/gpu_setup.sh
stage bench "${BENCH_S:-0}" tskernels-bench gemm.gemv --graph --json "$OUT/s24_bench_gemv.json"
TAIL=30 stage tests "${TEST_S:-0}" env OMP_NUM_THREADS=1 python -m pytest -m gpu -q -rfE \
    -p no:cacheprovider -n 4 --timeout 200 ${TESTS:-tests/kernels}
TAIL=40 stage heur "${HEUR_S:-0}" python benchmarks/s24_heuristics_gpu.py "$OUT"
stage agentic "${AGENTIC_S:-0}" python benchmarks/agentic_engine_bench.py \
    --model dummy:benchmarks/configs/llama-3-8b-64k.json --later-turns 5 --gap-modes lookahead \
    --gap-steps 30 --json "$OUT/s24_agentic_engine.json"
stage moe "${MOE_S:-0}" python benchmarks/s24_moe_rows_gpu.py "$OUT"
stage gemv "${GEMV_S:-0}" python benchmarks/s24_gemv_gpu.py "$OUT" $(( ${GEMV_S:-0} - 40 )) \
    ${GEMV_MODE:-}
# FEW_AB=1 (tree of e07478f, see s24_gemv_gpu.py): after a GEMV_MODE=few run, the rows configs with the least summed time at M = 2
# and at M = 4 become a ROWS_FEW literal, and serving at B = FEW_BATCH (default 4) is timed
# with it (AB_SETS "few") against the split kernel (the pair's "new" is the shipped tree)
if [ "${FEW_AB:-0}" = 1 ] && [ -f "$OUT/s24_gemv_few.json" ]; then
  FEW_LIT=$(python - "$OUT/s24_gemv_few.json" <<'PY'
import json, re, sys
rows = json.load(open(sys.argv[1]))["rows"]
out = {}
for m in (2, 4):
    rs = [r for r in rows if r["M"] == m]
    names = set.intersection(*(set(v for v in r["us"] if v.startswith("rows_")) for r in rs))
    best = min(names, key=lambda v: sum(r["us"][v] for r in rs))
    if sum(r["us"][best] for r in rs) < sum(r["us"]["shipped"] for r in rs):
        bn, bk, w = re.fullmatch(r"rows_(\d+)x(\d+)w(\d+)", best).groups()
        out[m] = dict(BN=int(bn), BK=int(bk), num_warps=int(w))
print(repr(out).replace(" ", ""))
PY
)
  echo "ROWS_FEW literal: $FEW_LIT"
  AB_SETS="few:--set tskernels.ops.gemm.triton_gemv.ROWS_FEW=$FEW_LIT"
  AB_BATCH=${FEW_BATCH:-4}
fi
if [ "${TIER_S:-0}" -gt 0 ]; then
  args=(); for kv in ${TIER_KERNELS:-}; do args+=(--kernel "$kv"); done
  stage tier "$TIER_S" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
      --out "$OUT/s24_gpu_tier${TAG:-}.json" --timeout $(( TIER_S - 15 )) \
      --pytest-arg=-n --pytest-arg=8 --pytest-arg=-p --pytest-arg=no:cacheprovider "${args[@]}"
fi
AB_OLD=${AB_OLD:-"--set tskernels.ops.gemm.triton_gemv.ROWS_M1=None"}
MODEL=${AB_MODEL:-dummy:llama-3-8b}; tag=${MODEL##*/}; tag=${tag%.json}; tag=${tag#dummy:}
stage extend "${EXT_S:-0}" python -m autotune --user-dir /tmp/at tune attention.extend \
    --shapes d=128,g=4,q=bf16,kv=bf16,causal=1,N=16384,P=0 --limit 4 --force \
    --json "$OUT/s24_extend_tune.json"
for i in $(seq 1 "${AB_PAIRS:-1}"); do
  hf=--no-hf; [ "$i" = 1 ] && [ "${AB_HF:-0}" = 1 ] && hf=
  stage "ab_${tag}_new$i" "${AB_S:-0}" python benchmarks/serve_ab.py -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 $hf --json "$OUT/s24_ab_${tag}_new$i.json"
  stage "ab_${tag}_old$i" "${AB_S:-0}" python benchmarks/serve_ab.py $AB_OLD -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 --no-hf --json "$OUT/s24_ab_${tag}_old$i.json"
done
IFS='|' read -ra sets <<< "${AB_SETS:-}"
for v in "${sets[@]}"; do
  vtag=${v%%:*}
  stage "ab_${tag}_$vtag" "${AB_S:-0}" python benchmarks/serve_ab.py ${v#*:} -- --model "$MODEL" \
      --batch ${AB_BATCH:-1} --new-tokens 48 --no-hf --json "$OUT/s24_ab_${tag}_$vtag.json"
done
