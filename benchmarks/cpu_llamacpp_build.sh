#!/usr/bin/env bash
# Build llama.cpp's shared library (CPU, this host's SIMD: GGML_NATIVE) from the llama.cpp that
# llama-cpp-python's sdist vendors, library target only, and print the environment that makes
# `import llama_cpp.llama_cpp` (the sdist's own ctypes bindings) load it. For
# benchmarks/serve_cpu_bench.py --modes llama.cpp where `pip install llama-cpp-python` (which
# also builds the tools, mtmd and the server) does not finish in reasonable time.
#
#   bash benchmarks/cpu_llamacpp_build.sh [DIR] [VERSION]    (default /tmp/llamacpp, 0.3.36)
set -euo pipefail
DIR=${1:-/tmp/llamacpp}
VER=${2:-0.3.36}
mkdir -p "$DIR"
cd "$DIR"
if [ ! -d "llama_cpp_python-$VER" ]; then
  python -m pip download --no-deps --no-binary=:all: -d . "llama-cpp-python==$VER"
  tar xzf "llama_cpp_python-$VER.tar.gz"
fi
SRC="$DIR/llama_cpp_python-$VER/vendor/llama.cpp"
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > "$DIR/cmake.log"
cmake --build "$DIR/build" --target llama -j "$(nproc)"
echo "export LLAMA_CPP_LIB_PATH=$DIR/build/bin"
echo "export PYTHONPATH=$DIR/llama_cpp_python-$VER\${PYTHONPATH:+:\$PYTHONPATH}"
