# Session 28 device stages (each under its own limit; 0, the default, skips it):
#   NCU_S / NCU_PROBLEMS: Nsight Compute (--set full) over benchmarks/ncu_probe.py problems,
#           "problem:kernel-regex" pairs -> $OUT/s28_ncu_<problem>.txt
#   CMD_S / CMD: any one command line (a lab script) under a limit
#   then the session-26 stages (benchmarks/s26_gpu.sh's variables), one archive back
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for pk in ${NCU_PROBLEMS:-}; do
  p=${pk%%:*}; k=${pk#*:}
  TAIL=4 stage "ncu_$p" "${NCU_S:-0}" ncu --clock-control none --kernel-name "regex:$k" \
      --launch-skip 1 --launch-count 1 --set full --print-details all python benchmarks/ncu_probe.py "$p"
  [ -f "$OUT/${STAGE_PREFIX:-stage}_ncu_$p.log" ] && cp "$OUT/${STAGE_PREFIX:-stage}_ncu_$p.log" "$OUT/s28_ncu_$p.txt"
done
TAIL=${CMD_TAIL:-40} stage cmd "${CMD_S:-0}" bash -c "${CMD:-true}"
source benchmarks/s26_gpu.sh
