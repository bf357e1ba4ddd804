"""Ahead-of-time compilation of Triton kernels for GPUs this machine may not have.

`compile_case(case, target)` runs Triton's whole pipeline (`triton.compile` on an `ASTSource`
with a `GPUTarget`) and returns the assembly plus the resources the compiled kernel uses:
registers, spills and shared memory. NVIDIA figures come from re-running the ptxas that Triton
ships with `-v`; AMD figures from the AMDGCN metadata. The compile-matrix tests and
`python -m tskernels.compile` use it.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGETS = {
    "sm_80": ("cuda", 80, 32),
    "sm_86": ("cuda", 86, 32),
    "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32),
    "sm_120": ("cuda", 120, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}

# Shared memory (LDS) one block may use on each target: a case compiled above it builds but
# could not launch there (records carry `fits`).
SHARED_LIMIT = {
    "sm_80": 166912,   # A100: 163 KB per block
    "sm_86": 101376,   # GA10x: 99 KB
    "sm_90": 232448,   # H100 / H200: 227 KB
    "sm_100": 232448,  # B200: 227 KB
    "sm_120": 101376,  # RTX 50 / PRO 6000: 99 KB
    "gfx942": 65536,   # MI300X / MI325X: 64 KB LDS
    "gfx950": 163840,  # MI355X: 160 KB LDS
}
# Not in TARGETS: gfx1250. Triton 3.6 compiles for it, but lowers tl.dot to FMAs: bf16, fp16
# and e4m3 dots of 16 and 64 rows became v_fma_f32 / v_pk_fma_f32 (no v_wmma), and gemm.mm's
# 64 x 128 tile took 1024 VGPRs with 1.8 KB of scratch: no matrix instruction to check yet.

# Triton's e4m3 (fp8e4nv) needs sm_89+: fp8 cases are not built for Ampere, whose kernels
# cannot take an e4m3 operand at all (CompilationError "type fp8e4nv not supported").
NO_E4M3 = frozenset({"sm_80", "sm_86"})

# The matrix instruction a tl.dot must become on each target.
MATRIX_INSTRUCTION = {
    "sm_80": re.compile(r"\bmma\.sync\.aligned"),
    "sm_86": re.compile(r"\bmma\.sync\.aligned"),
    "sm_90": re.compile(r"wgmma\.mma_async"),
    "sm_100": re.compile(r"tcgen05\.mma"),
    "sm_120": re.compile(r"\bmma\.sync\.aligned"),
    "gfx942": re.compile(r"v_mfma_"),
    "gfx950": re.compile(r"v_mfma_"),
}


@dataclass(frozen=True)
class CompileCase:
    """One specialisation of a @triton.jit kernel to compile: its signature (argument name ->
    Triton type such as "*bf16", "i32", "fp32"), constexpr values, launch options, and whether
    it multiplies matrices (tl.dot), so the matrix instruction must appear.

    Like Triton's JIT at run time, the compile specialises every pointer argument as 16-byte
    aligned; `aligned` names the integer arguments (strides) that are multiples of 16 at run
    time, which the JIT would specialise too. Without these hints the vectorisation and
    registers measured here would not be those of the kernels that run."""

    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    uses_dot: bool = False
    label: str = ""
    aligned: tuple[str, ...] = ()
    # only these targets (None: every target the kernel declares), for a specialisation that
    # only runs on some hardware (inline PTX, programmatic dependent launch)
    targets: tuple[str, ...] | None = None
    # its dots have fewer than 64 rows (M = 16: a few query heads), below wgmma / tcgen05's
    # M = 64, so sm_90 and sm_100 lower them to warp-level mma.sync: check for that instead
    narrow_dot: bool = False
    # further backend options of the launch (AMD: waves_per_eu, matrix_instr_nonkdim, kpack),
    # for cases restricted to the targets whose backend takes them
    options: tuple[tuple[str, Any], ...] = ()

    def builds_for(self, target: str) -> bool:
        """Whether the compile matrix builds this case for `target` (one the kernel declares):
        its own `targets` restriction, and no e4m3 operand on a target without e4m3."""
        if self.targets is not None and target not in self.targets:
            return False
        return not (target in NO_E4M3 and any("fp8e4nv" in str(t)
                                              for t in self.signature.values()))

    @property
    def name(self) -> str:
        base = getattr(self.fn, "__name__", None) or self.fn.fn.__name__
        return f"{base}[{self.label}]" if self.label else base


@dataclass(frozen=True)
class CompileResult:
    target: str
    asm: str
    registers: int | None
    spill_bytes: int | None
    shared_bytes: int
    has_matrix_instruction: bool


def _target(name: str):
    from triton.backends.compiler import GPUTarget

    backend, arch, warp = TARGETS[name]
    return GPUTarget(backend, arch, warp)


def _ptxas_resources(ptx: str) -> tuple[int | None, int | None]:
    from triton.backends.nvidia.compiler import get_ptxas

    arch = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "k.ptx")
        src.write_text(ptx)
        sm = int(re.match(r"sm_(\d+)", arch).group(1))
        try:
            ptxas = get_ptxas(sm)
        except TypeError:  # older Triton: get_ptxas() takes no argument
            ptxas = get_ptxas()
        path = ptxas.path if hasattr(ptxas, "path") else ptxas[0]
        proc = subprocess.run([path, "-v", f"--gpu-name={arch}", str(src), "-o",
                               str(Path(d, "k.cubin"))], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None)


def _amd_resources(asm: str) -> tuple[int | None, int | None]:
    vgpr = re.search(r"\.vgpr_count:\s+(\d+)", asm)
    scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", asm)
    return (int(vgpr.group(1)) if vgpr else None, int(scratch.group(1)) if scratch else None)


def compile_case(case: CompileCase, target: str) -> CompileResult:
    """Compile `case` for `target` (a key of TARGETS); raises on compiler errors."""
    import triton
    from triton.compiler import ASTSource

    sig = dict(case.signature)
    for k in case.constexprs:
        sig[k] = "constexpr"
    fn = case.fn.fn if hasattr(case.fn, "fn") and not hasattr(case.fn, "run") else case.fn
    hint = [["tt.divisibility", 16]]
    attrs = {(i,): hint for i, name in enumerate(fn.arg_names)
             if name in case.signature and (case.signature[name].startswith("*")
                                           or name in case.aligned)}
    src = ASTSource(fn=fn, signature=sig, constexprs=dict(case.constexprs), attrs=attrs)
    k = triton.compile(src, target=_target(target),
                       options={"num_warps": case.num_warps, "num_stages": case.num_stages,
                                **dict(case.options)})
    if target.startswith("sm_"):
        asm = k.asm["ptx"]
        regs, spills = _ptxas_resources(asm)
    else:
        asm = k.asm["amdgcn"]
        regs, spills = _amd_resources(asm)
    pattern = MATRIX_INSTRUCTION[target]
    if case.narrow_dot and target in ("sm_90", "sm_100"):
        pattern = MATRIX_INSTRUCTION["sm_120"]
    return CompileResult(target, asm, regs, spills, int(k.metadata.shared),
                         bool(pattern.search(asm)))


def all_cases() -> list[tuple[str, CompileCase, tuple[str, ...]]]:
    """(kernel name, case, targets) for every registered kernel that declares compile cases."""
    from . import registry

    out = []
    for spec in registry.kernels():
        if spec.compile_cases is None:
            continue
        for case in spec.compile_cases():
            out.append((spec.name, case, tuple(sorted(spec.verification.compiled))))
    return out


def _compile_apart(targets: list[str], kernels: str = "", jobs: int = 1) -> list[dict]:
    """Records of `python -m tskernels.compile --json F T`, one subprocess per target, up to
    `jobs` of them at once (each prints its table when it is done, in target order)."""
    import json
    import os
    import time

    out = []
    with tempfile.TemporaryDirectory() as d:
        procs: dict[str, subprocess.Popen] = {}
        pending = list(targets)
        running: list[str] = []

        def start(t):
            env = dict(os.environ)
            # a cache of its own too: entries a mixed-arch process wrote are not reused
            base = env.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache")
            env["TRITON_CACHE_DIR"] = os.path.join(base, f"tskernels-{t}")
            env["TSKERNELS_COMPILE_JOBS"] = "1"
            with open(Path(d, f"{t}.log"), "w") as log:
                procs[t] = subprocess.Popen(
                    [sys.executable, "-m", "tskernels.compile", "--json",
                     str(Path(d, f"{t}.json")), "--kernels", kernels, t], env=env, stdout=log,
                    stderr=subprocess.STDOUT)
            running.append(t)

        logs: dict[str, str] = {}
        while pending or running:
            while pending and len(running) < max(1, jobs):
                start(pending.pop(0))
            done = [t for t in running if procs[t].poll() is not None]
            if not done:
                time.sleep(0.2)
                continue
            for t in done:
                running.remove(t)
                procs[t].wait()
                logs[t] = Path(d, f"{t}.log").read_text(errors="replace")
        for t in targets:
            sys.stdout.write(logs[t])
            path = Path(d, f"{t}.json")
            out += json.loads(path.read_text()) if path.exists() else \
                [{"kernel": "*", "case": "*", "target": t, "declared": True, "ok": False,
                  "uses_dot": False, "error": f"the {t} compile process wrote no records"}]
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m tskernels.compile [--json FILE] [TARGET ...]: compile every registered case for
    its declared targets and print a resource table (and write JSON records)."""
    import argparse
    import json
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the compile matrix needs real @triton.jit kernels",
              file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="python -m tskernels.compile")
    ap.add_argument("targets", nargs="*", default=list(TARGETS))
    ap.add_argument("--json", help="write one record per (kernel, case, target)")
    ap.add_argument("--kernels", default="", help="only kernels whose name starts with this "
                                                   "(comma-separated prefixes)")
    args = ap.parse_args(argv)
    prefixes = tuple(p for p in args.kernels.split(",") if p)
    records = []
    jobs = int(os.environ.get("TSKERNELS_COMPILE_JOBS", "0") or 0) or (os.cpu_count() or 1)
    if jobs > 1 and len(args.targets) > 1:
        # one process per target, `jobs` at a time (the compiles are single-threaded)
        records = _compile_apart(list(args.targets), args.kernels, jobs)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)
        return 0 if all(r["ok"] for r in records if r["declared"]) else 1
    hip = [t for t in args.targets if TARGETS[t][0] == "hip"]
    if len(hip) > 1:
        # Triton 3.6 keeps AMD lowering state across compiles in one process: after a gfx942
        # build, gfx950 fp8 casts lowered like gfx942's (no v_cvt_scalef32_pk_bf16_fp8), and
        # after a gfx950 one, gfx942 builds emitted gfx950-only conversions (LLD: "instruction
        # not supported"). Each AMD arch therefore compiles in a process of its own.
        records += _compile_apart(hip, args.kernels)
        args.targets = [t for t in args.targets if t not in hip]
    print(f"{'kernel':<34} {'case':<40} {'target':<7} {'regs':>5} {'spill':>5} "
          f"{'smem':>7} matrix")
    for name, case, declared in all_cases():
        if prefixes and not name.startswith(prefixes):
            continue
        for t in args.targets:
            if not case.builds_for(t):
                continue
            rec = {"kernel": name, "case": case.name, "target": t, "declared": t in declared,
                   "uses_dot": case.uses_dot}
            try:
                r = compile_case(case, t)
                rec.update(ok=True, registers=r.registers, spill_bytes=r.spill_bytes,
                           shared_bytes=r.shared_bytes, matrix=r.has_matrix_instruction,
                           fits=r.shared_bytes <= SHARED_LIMIT[t])
                mi = ("yes" if r.has_matrix_instruction else "NO") if case.uses_dot else "-"
                print(f"{name:<34} {case.name:<40} {t:<7} {r.registers or '-':>5} "
                      f"{r.spill_bytes if r.spill_bytes is not None else '-':>5} "
                      f"{r.shared_bytes:>7} {mi}")
            except Exception as e:  # recorded; the compile-matrix test reports it
                rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
                print(f"{name:<34} {case.name:<40} {t:<7} FAILED {type(e).__name__}")
            records.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0 if all(r["ok"] for r in records if r["declared"]) else 1


if __name__ == "__main__":
    sys.exit(main())
