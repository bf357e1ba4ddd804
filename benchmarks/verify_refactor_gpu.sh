#!/usr/bin/env bash
# Lab script: the H200 acceptance run of the architecture refactor — the GPU tier of every
# refactored kernel, then `tskernels-bench` decode / extend / MLA of the old tree (.old/, a
# `git archive` of the commit before the refactor) and of this tree, interleaved in one run.
#   (cd repo && rm -rf .old && mkdir .old && git archive OLD_COMMIT | tar -x -C .old)
#   device run: bash benchmarks/verify_refactor_gpu.sh   (carry: .gpuwhl .old)
# Env: HYPOTHESIS_PROFILE (default gpu), TIER_TIMEOUT (s, default 300), BENCH_TIMEOUT (s, 150).
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpuwhl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$ROOT PYTHONUNBUFFERED=1
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

# The C++ scheduler for the serving graph tests builds while the kernel tier runs.
(pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; echo "build rc $?" >> "$OUT/build.log") &
BUILD=$!

KERNEL_TESTS="tests/kernels/test_attention_decode.py tests/kernels/test_attention_extend.py
 tests/kernels/test_attention_cuda.py tests/kernels/test_attention_cuda_numerics.py
 tests/kernels/test_attention_cuda_extend.py tests/kernels/test_attention_cuda_paged_extend.py
 tests/kernels/test_attention_cuda_extend_numerics.py tests/kernels/test_attention_graph.py
 tests/kernels/test_attention_tuned.py tests/kernels/test_mla.py tests/kernels/test_mla_cuda.py
 tests/kernels/test_mla_cuda_numerics.py tests/kernels/test_store_kv.py
 tests/kernels/test_store_mla.py tests/kernels/test_merge_states.py tests/kernels/test_norm.py
 tests/kernels/test_rope.py tests/kernels/test_activation.py tests/registry/test_conformance.py
 tests/autotune"
timeout "${TIER_TIMEOUT:-300}" python -m pytest -m gpu -q -p no:cacheprovider --durations=10 \
    --junitxml "$OUT/gpu_tier_kernels.xml" $KERNEL_TESTS > "$OUT/gpu_tier_kernels.log" 2>&1
echo "kernel tier rc $?"; tail -25 "$OUT/gpu_tier_kernels.log"

wait $BUILD; tail -2 "$OUT/build.log"
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider --junitxml "$OUT/gpu_tier_serve.xml" \
    tests/serve/test_cuda_graphs.py > "$OUT/gpu_tier_serve.log" 2>&1
echo "serve tier rc $?"; tail -8 "$OUT/gpu_tier_serve.log"

# Old and new benches, twice each, interleaved (new, old, new, old): drift hits both alike.
for round in 1 2; do
  for tree in new old; do
    dir=$ROOT; [ "$tree" = old ] && dir=$ROOT/.old
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout "${BENCH_TIMEOUT:-150}" python -m tskernels.bench.cli \
        attention.decode attention.extend mla.decode --graph --json "$OUT/bench_${tree}_$round.json" \
        > "$OUT/bench_${tree}_$round.log" 2>&1; echo "bench $tree $round rc $?")
  done
done
python - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def rows(tree):
    got = {}
    for r in (1, 2):
        p = out / f"bench_{tree}_{r}.json"
        if not p.exists():
            continue
        data = json.loads(p.read_text())
        for run in data if isinstance(data, list) else [data]:
            for row in run.get("rows", []):
                key = (run["op"], json.dumps(row["shape"], sort_keys=True))
                us = (row.get("ours") or {}).get("us")
                if us is not None:
                    got.setdefault(key, []).append(us)
    return {k: min(v) for k, v in got.items()}
new, old = rows("new"), rows("old")
print(f"{'op':18} {'shape':60} {'old us':>9} {'new us':>9} {'new/old':>8}")
table = []
for k in sorted(set(new) & set(old)):
    table.append(dict(op=k[0], shape=k[1], old_us=old[k], new_us=new[k], ratio=new[k] / old[k]))
    print(f"{k[0]:18} {k[1][:60]:60} {old[k]:9.2f} {new[k]:9.2f} {new[k] / old[k]:8.3f}")
(out / "refactor_bench.json").write_text(json.dumps(table, indent=1))
EOF
