# Session 29 device stages (each under its own limit; 0, the default, skips it):
#   FP8_S / FP8_MS: benchmarks/s16_fp8_gpu.py with the one-pass tile widths beside the shipped
#           256-wide config (FP8_CONFIGS below unless set), M list FP8_MS -> $OUT/s29_fp8.json
#   ROUTER_S: benchmarks/s28_router_gpu.py (the fused MoE router vs the three launches)
#   ALIGN_S: benchmarks/s29_align_gpu.py (align's offsets pass, E_P / 8 programs vs one;
#           benchmarks/_s29_align_old.py: the previous tree's triton_align.py, made by the caller)
#   MOETMA_S: benchmarks/s29_moe_tma_gpu.py, removed with what it measured (in git at 980a79d)
#   MOEPROF_S: benchmarks/moe_profile.py --tokens 1024 8192 (the layer's per-kernel times)
#   then the session-28 / 26 stages (benchmarks/s28_gpu.sh's variables), one archive back
export FP8_CONFIGS=${FP8_CONFIGS:-'{"bn176_s4": {"block_n": 176, "stages": 4}, "bn176_s5": {"block_n": 176, "stages": 5}, "bn192_s4": {"block_n": 192, "stages": 4}, "bn160_s5": {"block_n": 160, "stages": 5}, "bn144_s5": {"block_n": 144, "stages": 5}}'}
export FP8_OUT=s29_fp8.json
source benchmarks/gpu_setup.sh
TAIL=24 stage fp8 "${FP8_S:-0}" python benchmarks/s16_fp8_gpu.py "$OUT" $(( ${FP8_S:-0} - 30 )) ${FP8_MS:-4096,2048,1024}
TAIL=12 stage align "${ALIGN_S:-0}" python benchmarks/s29_align_gpu.py "$OUT"
TAIL=30 stage moeprof "${MOEPROF_S:-0}" python benchmarks/moe_profile.py --tokens 1024 8192 --json "$OUT/s29_moe_profile.json"
TAIL=6 stage router "${ROUTER_S:-0}" python benchmarks/s28_router_gpu.py "$OUT" $(( ${ROUTER_S:-0} - 20 ))
source benchmarks/s28_gpu.sh
