#!/usr/bin/env bash
# The GPU work still owed, in one device call (writes JSON + the streamed pytest log under $OUT;
# ~8-10 minutes):
#   1. GPU tier for what is not yet run-verified (extend, the serving CUDA graphs, decode's
#      shipped tuned configs), in parallel
#      over the machine's CPU cores (the time goes to Triton JIT compiles), gpu profile;
#   2. the serving figure (dummy Llama-3-8B shape vs HF generate).
# Starlette/uvicorn/pyzmq wheels (not in the device image) are installed from an ignored .whl/
# folder when carried there.
# Usage on the device: bash benchmarks/gpu_pending.sh   (PYTHONPATH=. is set here)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# each property test is split into 15 seeded shards (TSKERNELS_TEST_SHARDS) that xdist spreads
# over the cores: the time goes to Triton JIT compiles of the specialisations the examples draw
export TSKERNELS_TEST_SHARDS=15
# one CPU thread per xdist worker: the float64 references on the host otherwise oversubscribe
export OMP_NUM_THREADS=1
# the C++ extensions first (the serve tests need the scheduler)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=$PWD:/tmp/site
python -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python -c "import scheduler" 2>/dev/null || {  # fall back to a direct CMake build of the extension
  cmake -S . -B /tmp/ext -DPython_EXECUTABLE="$(which python)" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build /tmp/ext -j 16 >/dev/null && cp /tmp/ext/_core*.so scheduler/; }
P="--pytest-arg=-n --pytest-arg=15 --pytest-arg=-p --pytest-arg=no:cacheprovider --pytest-arg=--timeout=240"
timeout 340 python benchmarks/gpu_tier.py --timeout 320 --out "$OUT/gpu_tier_pending.json" $P \
  --kernel attention.extend.triton=tests/kernels/test_attention_extend.py \
  --kernel serve.cuda_graphs=tests/serve/test_cuda_graphs.py \
  --kernel 'attention.decode.triton(tuned)=tests/kernels/test_attention_tuned.py' \
  2>&1 | tail -25
unset OMP_NUM_THREADS TSKERNELS_TEST_SHARDS
timeout 230 python benchmarks/serve_gpu_bench.py --profile --json "$OUT/serve_gpu.json" 2>&1 | grep -v warn | tail -40
