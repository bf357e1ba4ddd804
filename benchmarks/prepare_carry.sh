#!/usr/bin/env bash
# Lab helper, run on the development machine before device calls: makes the ignored folders
# the device scripts take with `carry` (a fresh checkout has neither).
#   .gpuwhl: the server wheels (../shared/wheels/cp312); gpu_setup.sh installs them into
#            /tmp/site on the device and builds the cp312 scheduler extension there when
#            .gpuwhl/sched312 holds none (this machine's Python is not 3.12)
#   .whl:    flash-linear-attention / fla-core 0.6.0 and einops, the GDN baseline of
#            benchmarks/s15_gdn_gpu.py (from the package index)
# The default model's converted directory (.gpuwhl/tokcache) is not made: it is larger than
# carry allows, and the kernel stages (GPU tier, GDN, sampling) do not load it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpuwhl .whl
cp ../shared/wheels/cp312/*.whl .gpuwhl/
pip download -q --no-deps -d .whl flash-linear-attention==0.6.0 fla-core==0.6.0 einops==0.8.2
du -sh .gpuwhl .whl
