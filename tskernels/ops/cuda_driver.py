"""NVRTC compile, driver-API module loading, TMA descriptors and launches for the hand-written
Hopper kernels (cuda-python's `cuda.bindings`). CuPy's compile picks the portable sm_90 target,
which has no wgmma / setmaxnreg; these kernels need the arch-specific sm_90a, and their TMA
descriptors are 128-byte by-value kernel parameters, which CuPy's launcher does not pass.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from pathlib import Path

import torch

# the kernels' shared header (hopper_common.cuh): nvcc gets its directory as an include path;
# NVRTC gets the same option and, so that nothing depends on the file system or on option
# parsing, the header's text as a named header of the program
INCLUDE_DIR = Path(__file__).with_name("cuda_include")
INCLUDE = f"--include-path={INCLUDE_DIR}"

_lock = threading.Lock()
_modules: dict[tuple, tuple] = {}


def driver():
    try:
        from cuda.bindings import driver as cu
    except ImportError:  # pragma: no cover - cuda-python < 12.6 names it cuda.cuda
        from cuda import cuda as cu
    return cu


def check(err, what: str) -> None:
    cu = driver()
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver: {what} failed ({err})")


def nvrtc_cubin(source: str, name: str, options: tuple[str, ...], arch: str) -> bytes:
    """Compile `source` with NVRTC for exactly `arch` (e.g. sm_90a) and return the cubin."""
    from cuda.bindings import nvrtc

    def ok(res, what):
        err = res[0] if isinstance(res, tuple) else res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC {what} failed: {err}")
        return res[1:] if isinstance(res, tuple) else None

    headers = sorted(INCLUDE_DIR.glob("*.cuh"))
    prog, = ok(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), len(headers),
                                        [h.read_bytes() for h in headers],
                                        [h.name.encode() for h in headers]), "create")
    opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
    res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size, = ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC compile of {name} failed:\n{log.decode(errors='replace')}")
    size, = ok(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "get cubin")
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin


def cubin_cache_dir() -> Path | None:
    """Where compiled cubins are kept between processes: $TSKERNELS_CACHE/cubin (default
    ~/.cache/tskernels/cubin); None when TSKERNELS_CUBIN_CACHE=0."""
    if os.environ.get("TSKERNELS_CUBIN_CACHE", "1") == "0":
        return None
    base = os.environ.get("TSKERNELS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tskernels")
    return Path(base) / "cubin"


def cached_cubin(source: str, name: str, options: tuple[str, ...], arch: str) -> bytes:
    """nvrtc_cubin through a disk cache, so that a new process does not rebuild the kernels
    it used before: an engine's first paged extend pays the NVRTC builds of its split / packed
    variants in that request's TTFT (on a fresh H200, with the merge kernel's first Triton
    compile, a later agent turn took 247 ms instead of ~74; Triton keeps its own disk cache).
    The key hashes the source, the shared headers' text, the options, the arch and the NVRTC
    version; a file that is not an ELF image is rebuilt; an unwritable cache only costs the
    rebuild."""
    from cuda.bindings import nvrtc
    root = cubin_cache_dir()
    if root is None:
        return nvrtc_cubin(source, name, options, arch)
    h = hashlib.sha256()
    for part in (source, *options, arch, repr(nvrtc.nvrtcVersion()[1:])):
        h.update(part.encode() + b"\0")
    for header in sorted(INCLUDE_DIR.glob("*.cuh")):
        h.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    path = root / f"{Path(name).stem}-{arch}-{h.hexdigest()[:32]}.cubin"
    try:
        cubin = path.read_bytes()
        if cubin.startswith(b"\x7fELF"):
            return cubin
    except OSError:
        pass
    cubin = nvrtc_cubin(source, name, options, arch)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(cubin)
        tmp.replace(path)   # atomic: a concurrent reader sees the old file or the whole new one
    except OSError as e:
        logging.getLogger("tskernels").debug("cubin cache %s not written: %s", root, e)
    return cubin


def sm90a_function(device: torch.device, path, kernel: str, options: tuple[str, ...],
                   smem: int, what: str):
    """The kernel `kernel` of the source file `path` compiled for sm_90a with `options`, loaded
    once per (device, file, options) into the device's primary context (torch's), its dynamic
    shared memory limit raised to `smem` bytes. Returns the CUfunction."""
    return arch_function(device, path, kernel, options, smem, what, {(9, 0): "sm_90a"},
                         "sm_90a (Hopper)")


def arch_function(device: torch.device, path, kernel: str, options: tuple[str, ...], smem: int,
                  what: str, archs: dict[tuple[int, int], str], family: str):
    """`sm90a_function` for the arch-specific target `archs[capability]` of the device (e.g.
    {(10, 0): "sm_100a", (10, 3): "sm_103a"}); a device of another capability is refused with
    `family` named."""
    key = (device.index, str(path), kernel, options)
    with _lock:
        if key not in _modules:
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) not in archs:
                raise RuntimeError(f"{what}: {family} only, device is sm_{major}{minor}")
            cubin = cached_cubin(path.read_text(), path.name, options, archs[(major, minor)])
            cu = driver()
            with torch.cuda.device(device):
                torch.cuda.init()
                image = ctypes.create_string_buffer(cubin)
                err, mod = cu.cuModuleLoadData(ctypes.addressof(image))
                check(err, "cuModuleLoadData")
                err, fn = cu.cuModuleGetFunction(mod, kernel.encode())
                check(err, "cuModuleGetFunction")
                err, = cu.cuFuncSetAttribute(
                    fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem)
                check(err, "cuFuncSetAttribute")
            _modules[key] = (mod, fn)  # the module owns the loaded code
        return _modules[key][1]


def tensor_map_2d(t: torch.Tensor, rows: int, cols: int, row_bytes: int, box_rows: int,
                  box_cols: int = 64, swizzle: bool = True) -> ctypes.Array:
    """The TMA descriptor (CUtensorMap, 128 bytes) of a 16-bit or 8-bit tensor seen as 2-D
    [rows, cols] from t's data pointer with `row_bytes` between rows: boxes of box_cols x
    box_rows, 128-byte swizzle (the layout the wgmma descriptors read) or none, rows past the
    end read as zeros."""
    cu = driver()
    T = cu.CUtensorMapDataType
    dt = {torch.bfloat16: T.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
          torch.float16: T.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
          torch.float8_e4m3fn: T.CU_TENSOR_MAP_DATA_TYPE_UINT8}[t.dtype]
    sw = cu.CUtensorMapSwizzle
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    rest = ([u64(cols), u64(rows)], [u64(row_bytes)], [u32(box_cols), u32(box_rows)],
            [u32(1), u32(1)], cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            sw.CU_TENSOR_MAP_SWIZZLE_128B if swizzle else sw.CU_TENSOR_MAP_SWIZZLE_NONE,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    try:
        err, tmap = cu.cuTensorMapEncodeTiled(dt, 2, t.data_ptr(), *rest)
    except TypeError:  # bindings that want the rank typed as well
        err, tmap = cu.cuTensorMapEncodeTiled(dt, u32(2), t.data_ptr(), *rest)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err}) for {tuple(t.shape)} "
                           f"strides {tuple(t.stride())} as [{rows}, {cols}]")
    buf = (ctypes.c_ubyte * 128)()
    ctypes.memmove(buf, tmap.getPtr(), 128)
    return buf


def launch(fn, grid: int, threads: int, smem: int, device: torch.device, args,
           pdl: bool = False) -> None:
    """cuLaunchKernel on torch's current stream of `device`, each argument's bytes given by a
    ctypes object. The device is made current around it: the function belongs to its context.
    pdl: a programmatic dependent launch (cuLaunchKernelEx with programmatic stream
    serialization: the grid may start before its predecessor completes, so the kernel must
    execute griddepcontrol.wait before it reads anything the predecessor writes)."""
    cu = driver()
    ptrs = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        if not pdl:
            err, = cu.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, smem, cu.CUstream(stream),
                                     ctypes.addressof(ptrs), 0)
        else:
            cfg = cu.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
            cfg.sharedMemBytes = smem
            cfg.hStream = cu.CUstream(stream)
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            err, = cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0)
    check(err, "cuLaunchKernel")
