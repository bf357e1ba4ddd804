"""Registers and stack of the split-KV merge kernel per tile shape, from an ahead-of-time
build (no GPU needed): triton.compile for sm_90, `cuobjdump -res-usage` of the cubin (the one
shipped with triton). Prints a table; the figures quoted in RESULTS.md ("mla.decode —
session 8") come from it.

    python benchmarks/merge_registers.py > benchmarks/results/merge_registers_sm90.txt
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tskernels.ops.shared.split_kv import merge_kernel as _merge_kernel

SIG = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "sink_ptr": "*fp32", "o_ptr": "*bf16",
       "num_splits": "i32", "H": "i32", "o_sb": "i32", "o_sh": "i32"}
# (BLOCK_S, BLOCK_D, D, num_warps): the attention decode's rows (128) and MLA's (512)
CASES = [(16, 128, 128, 1), (32, 128, 128, 1), (64, 128, 128, 1), (32, 128, 128, 4),
         (64, 128, 128, 4), (4, 512, 512, 4), (8, 512, 512, 4), (32, 512, 512, 4),
         (64, 512, 512, 4), (64, 64, 512, 4)]


def main() -> None:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                             "cuobjdump")
    print(f"triton {triton.__version__}, target sm_90")
    print("BLOCK_S BLOCK_D D warps | resources")
    for bs, bd, d, nw in CASES:
        # (ROW=0: whole rows, as the attention decode launches it)
        consts = dict(D=d, BLOCK_D=bd, BLOCK_S=bs, SINKS=False, PDL=False,
                      ROW=0 if bd == d else d)
        sig = dict(SIG, **{k: "constexpr" for k in consts})
        k = triton.compile(ASTSource(fn=_merge_kernel, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=nw))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                                 text=True, check=True).stdout
        res = next((ln.strip() for ln in out.splitlines() if "REG" in ln), out.strip())
        print(f"{bs:7d} {bd:7d} {d:3d} {nw:5d} | {res}")


if __name__ == "__main__":
    main()
