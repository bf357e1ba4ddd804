"""One attention problem per process, for Nsight Compute: builds the inputs, runs our kernel
twice (the first launch compiles and warms up; profile the second with --launch-skip).

    ncu --clock-control none --kernel-name regex:'_decode_kernel|_extend_kernel|_mla_kernel' \\
        --launch-skip 1 --launch-count 1 --section SpeedOfLight ... \\
        python benchmarks/ncu_probe.py decode_fp8      # decode_bf16 | extend | mla
                                                       # | extend_cuda (prefill_wgmma_kernel)
                                                       # | mla_cuda (mla_decode_wgmma_kernel)
                                                       # | extend_later (paged, NCU_LATER=PxN)
                                                       # | fp8_cuda[_MxNxK] (fp8_block_mm_kernel;
                                                       #   or NCU_FP8=MxNxK; NCU_FP8_CFG=JSON)
                                                       # | moe_decode_cuda | moe_decode_triton
                                                       #   (routing + fused_experts, T = 1)

Problems: decode B=128 L=8192 (bf16 or fp8 per-tensor KV; GQA 32/8, d128, page 16), extend
16384 new tokens causal with their own K/V (tensor descriptors), MLA decode B=64 L=4096.
"""
from __future__ import annotations

import os
import sys

import torch

os.environ.setdefault("TSKERNELS_BACKEND", "attention=triton,mla=triton")


def main(which: str) -> None:
    from tskernels.bench.cases import attention as A
    gen = torch.Generator("cuda").manual_seed(0)
    if which.startswith("decode"):
        shape = {"B": 128, "L": 8192, "fp8": int(which.endswith("fp8"))}
        # NCU_SHAPE="B=16,L=4096": another decode shape
        shape.update({k: int(v) for k, v in (x.split("=") for x in
                                              filter(None, os.environ.get("NCU_SHAPE", "").split(",")))})
        d = A._prepare_decode(A._make_decode(shape, "cuda", gen))
        del d["kcont"], d["vcont"]
        # NCU_DECODE="keys_m=1,q_fp8=2": plan attributes of a kernel form to profile
        for kv in filter(None, os.environ.get("NCU_DECODE", "").split(",")):
            key, val = kv.split("=")
            if not hasattr(d["plan"], key):
                raise SystemExit(f"NCU_DECODE: the decode plan has no attribute {key!r}")
            setattr(d["plan"], key, int(val))
        run = lambda: A._ours_decode(d)  # noqa: E731
    elif which == "extend":
        d = A._prepare_extend(A._make_extend({"N": 16384, "P": 0}, "cuda", gen))
        run = lambda: d["plan"].run(d["q"], d["kc"], d["vc"], out=d["out"],  # noqa: E731
                                    k=d["knew"], v=d["vnew"])
    elif which == "extend_cuda":  # the CUDA (wgmma) prefill, 4096 new tokens
        from tskernels.ops.attention import cuda_extend as ce
        d = A._make_extend({"N": 4096, "P": 0}, "cuda", gen)
        # NCU_EXTEND="STAGES=2,NOPINGPONG": launch config / -D options of the CUDA source
        opts = [x for x in os.environ.get("NCU_EXTEND", "").split(",") if x]
        kv = dict(x.split("=") for x in opts if x.startswith(("STAGES=", "BN=")))
        plan = ce.CudaExtendPlan(d["qo"], d["pt"], d["lens"], num_q_heads=32, num_kv_heads=8,
                                 head_dim=128, page_size=16, q_dtype=torch.bfloat16,
                                 kv_dtype=torch.bfloat16, scale=128 ** -0.5,
                                 stages=int(kv.get("STAGES", ce.STAGES)),
                                 block_n=int(kv.get("BN", ce.BLOCK_N)),
                                 extra=tuple(f"-D{x}" for x in opts
                                             if not x.startswith(("STAGES=", "BN="))))
        out = torch.empty_like(d["q"])
        run = lambda: plan.run(d["q"], d["kc"], d["vc"], out=out, k=d["knew"],  # noqa: E731
                               v=d["vnew"])
    elif which == "extend_later":  # the agentic later turn: 50.8k cached + 800 new, paged
        # (64-slot pages, permuted page table), GQA-packed, the plan's own split (issue 20)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import s15_extend_gpu as s15
        from tskernels.ops.attention.cuda_extend import CudaExtendPlan
        shape = os.environ.get("NCU_LATER", "50800x800")
        pre, new = (int(x) for x in shape.split("x"))
        indptr, pt, seq, data = s15._problem([pre], [new], torch.Generator().manual_seed(0), 1,
                                             64)
        plan = CudaExtendPlan(indptr, pt, seq, num_q_heads=s15.HQ, num_kv_heads=s15.HKV,
                              head_dim=s15.D, page_size=64, q_dtype=torch.bfloat16,
                              kv_dtype=torch.bfloat16, scale=s15.D ** -0.5, paged=True,
                              gqa_pack=True)
        x = data[0]
        run = lambda: plan.run(x["q"], x["kc"], x["vc"], out=x["out"])  # noqa: E731
    elif which.startswith("mla"):  # mla (Triton) | mla_cuda (mla_decode_wgmma_kernel)
        from tskernels.bench.cases import mla as M
        if which == "mla_cuda":
            os.environ["TSKERNELS_BACKEND"] = "mla=cuda"
        # NCU_MLA="H=16,B=64,L=4096,fp8=1" (default 128 heads, B=64, L=4k, bf16 latents)
        shape = {"B": 64, "L": 4096, "fp8": 0, "H": 128}
        shape.update({k: int(v) for k, v in (kv.split("=") for kv in
                                             os.environ.get("NCU_MLA", "").split(",") if kv)})
        d = M._prepare(M._make(shape, "cuda", gen))
        run = lambda: d["plan"].run(d["q"], d["cache"], kv_scale=d.get("scale"),  # noqa: E731
                                    out=d["out"])
    elif which.startswith("fp8_cuda"):  # the CUDA block-fp8 GEMM; fp8_cuda_MxNxK: that shape
        import json
        from tskernels.bench.cases import gemm as G
        from tskernels.ops.gemm import cuda_fp8_sm90 as cf
        shape = which[len("fp8_cuda_"):] or os.environ.get("NCU_FP8", "4096x7168x16384")
        m, n, k = (int(x) for x in shape.split("x"))
        d = G._fp8_make({"M": m, "N": n, "K": k}, "cuda", gen)
        o = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        cfg = json.loads(os.environ["NCU_FP8_CFG"]) if os.environ.get("NCU_FP8_CFG") else None
        run = lambda: cf.run(d["a"], d["sa"], d["b"], d["sb"], o, cfg)  # noqa: E731
    elif which in ("moe_decode_cuda", "moe_decode_triton"):  # issue 24's T = 1 MoE layer:
        # routing (Triton) then fused_experts (moe_decode_kernel | the two triton_direct kernels)
        from tskernels import moe
        from tskernels.bench.cases import moe as MC
        d = MC._make({"T": 1, **MC.QWEN3}, "cuda", gen)
        backend = "cuda_sm90" if which.endswith("cuda") else "triton"

        def run():
            w, ids = moe.topk_softmax(d["logits"], d["k"], backend="triton")
            return moe.fused_experts(d["x"], d["w13"], d["w2"], w, ids, backend=backend)
    else:
        raise SystemExit(f"unknown problem {which}")
    for _ in range(2):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
