# Session 31 device stages (each under its own limit; 0, the default, skips it):
#   MTIER_S: benchmarks/gpu_tier.py over tests/kernels/test_moe_decode_cuda.py (the one-token
#           CUDA MoE kernel) -> $OUT/s31_gpu_tier_moe_decode.json; when it passed, the device
#           copy's verified.json gains the kernel (so the serving A/B's default selects it)
#   MOEDEC_S: benchmarks/s31_moe_decode_gpu.py (CUDA one-launch vs Triton two-launch, T = 1)
#   SAMPLER_S: benchmarks/s25_sampler_gpu.py (the group-max sampler's PDL forms)
#   then the session-28 / 26 stages (benchmarks/s28_gpu.sh's variables), one archive back
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
TAIL=30 stage mtier "${MTIER_S:-0}" env HYPOTHESIS_PROFILE=ci python benchmarks/gpu_tier.py \
    --out "$OUT/s31_gpu_tier_moe_decode.json" --timeout $(( ${MTIER_S:-0} - 15 )) \
    --pytest-arg=-p --pytest-arg=no:cacheprovider \
    --kernel moe.fused_experts.cuda_sm90=tests/kernels/test_moe_decode_cuda.py
if [ -f "$OUT/s31_gpu_tier_moe_decode.json" ]; then
  python - "$OUT/s31_gpu_tier_moe_decode.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if r["passed"].get("moe.fused_experts.cuda_sm90"):
    v = json.load(open("tskernels/verified.json"))
    v["kernels"]["moe.fused_experts.cuda_sm90"] = {"run": {r["target"]: f"{r['date']} device run"}}
    json.dump(v, open("tskernels/verified.json", "w"), indent=1)
    print("verified.json (device copy): moe.fused_experts.cuda_sm90 added")
PY
fi
TAIL=16 stage moedec "${MOEDEC_S:-0}" python benchmarks/s31_moe_decode_gpu.py "$OUT" $(( ${MOEDEC_S:-0} - 30 ))
TAIL=14 stage sampler "${SAMPLER_S:-0}" python benchmarks/s25_sampler_gpu.py "$OUT" $(( ${SAMPLER_S:-0} - 30 ))
source benchmarks/s28_gpu.sh
