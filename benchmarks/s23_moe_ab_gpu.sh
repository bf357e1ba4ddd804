#!/usr/bin/env bash
# Lab script (session 23): the prefill MoE layer of HEAD against the tree of 20f7879 (its
# first H200 measurement: T = 8192 1527 us), alternately, in one call. The old tree is a
# `git archive 20f7879 tskernels tskernels_ref autotune` in .cache/moe_old (carry it).
source benchmarks/gpu_setup.sh >/dev/null 2>&1
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
for tree in old new old new; do
  if [ $tree = old ]; then PP=$PWD/.cache/moe_old; else PP=$PWD; fi
  PYTHONPATH=/tmp/site:$PP timeout 150 python benchmarks/s23_moe_ab.py $tree ${MOE_T:-8192} 2>&1 \
      | grep -v -i warn | tail -5 | tee -a "$OUT/s23_moe_ab.jsonl"
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
