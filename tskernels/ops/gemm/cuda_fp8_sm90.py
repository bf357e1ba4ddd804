"""Hand-written block-scaled fp8 GEMM for Hopper (`cuda/fp8_block_wgmma.cu`): the prefill
shapes of `gemm.fp8_block_mm` (DeepSeek-V3 layout: 1 x 128 activation groups, 128 x 128 weight
blocks, fp32 accumulation).

What it adds over the Triton kernel: every K block's product is scaled before it joins the
accumulator; Triton 3.6 on sm_90 waits for each wgmma and promotes with the tensor cores idle,
while here a producer warpgroup feeds a TMA ring and two consumer warpgroups alternate MMAs and
promotion (the source's header has the design). Auto-selected only above 64 rows (`prefer`):
decode rows stream the weight through the Triton split-K kernel. Tile width: [128 x 256]
(CONFIG), or a one-pass width (144-192, `choose_config`) where 256-wide tiles leave a narrow
last column and the wave model says it pays (N = 2112 at M = 1024-4096: 1.12-1.29x).

Compiled at first use with NVRTC for sm_90a, launched with the driver API on torch's current
stream; the operands' TMA descriptors are encoded on the host per call (no device work, no
sync: CUDA-graph capturable). Operands whose rows are not 16-byte aligned (K % 16, a strided
view) are copied once into a padded buffer (TMA's requirement).

Verification: tests/compile/test_cuda_sources.py builds every config with nvcc and checks the
e4m3 warpgroup MMAs (QGMMA) and TMA copies in the SASS; the GPU tier
(tests/kernels/test_gemm_cuda_fp8.py) runs it against the float64 reference on the H200.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ...platform import platform_of
from ...registry import Capability, register
from .. import cuda_driver

SOURCE = Path(__file__).with_name("cuda") / "fp8_block_wgmma.cu"
KERNEL = "fp8_block_mm_kernel"
BLOCK = 128            # the scale blocks this kernel takes (K and weight rows)
BLOCK_M = 128          # tile rows: two consumer warpgroups x 64
THREADS = 384          # producer + two consumer warpgroups
SMEM_LIMIT = 232448    # sm_90's opt-in dynamic shared memory per block
# block_n: tile columns (128 or 256); stages: ring depth; pipe: two temporaries per consumer
# (K blocks in pairs, block_n 128 only); group_m: tile rows (cluster: tile-row pairs) walked
# together (L2 reuse); cluster: 2 = CTA pairs sharing (multicasting) the weight tile; cbuf:
# 64-column shared staging buffers per consumer for the TMA-store epilogue (0: direct stores
# from registers); a lab run may add "extra": more -D options
# The shipped config: [128 x 256] tiles, 3 stages, the TMA-store epilogue with two staging
# buffers per consumer, 8 tile rows per group: the best of the measured configs on the H200 at
# M = 4096 (DeepSeek-V3 shapes) and 8192^3 over two runs (benchmarks/RESULTS.md, "Session 16")
CONFIG = {"block_n": 256, "stages": 3, "pipe": False, "group_m": 8, "cluster": 1, "cbuf": 2}
# one-pass tile widths (one m64nBNk32 batch per K block; scales per 8 columns): for N whose
# 256-wide tiles leave a partial last wave (see choose_config)
ONE_PASS = (144, 160, 176, 192)
BLOCK_NS = (128, 256) + ONE_PASS


def smem_bytes(block_n: int, stages: int, cbuf: int = 0) -> int:
    """The ring (A [128 x 128] and B [block_n x 128] e4m3 per stage), the epilogue's staging
    buffers (cbuf x [64 x 64] 16-bit per consumer warpgroup), each stage's scales (128 + 8
    floats), the mbarriers and 1 KB of alignment slack (the source's SMEM_BYTES)."""
    return (stages * (BLOCK_M + block_n) * BLOCK + 2 * max(cbuf, 1) * 64 * 128
            + stages * (BLOCK_M + 8) * 4 + 16 * stages + 1024)


def nvcc_options(block_n: int, stages: int, pipe: bool, out_dtype: torch.dtype,
                 cluster: int = 1, cbuf: int = 0) -> tuple[str, ...]:
    out = {torch.bfloat16: (), torch.float16: ("-DOUT_F16",), torch.float32: ("-DOUT_F32",)}
    return ("-std=c++17", cuda_driver.INCLUDE, f"-DBN={block_n}", f"-DSTAGES={stages}",
            *(("-DPIPE",) if pipe else ()), *((f"-DCLUSTER={cluster}",) if cluster > 1 else ()),
            f"-DCBUF={max(cbuf, 1)}", *out[out_dtype])


def check_config(cfg: dict) -> dict:
    cfg = {**CONFIG, **(cfg or {})}
    bn, stages = cfg["block_n"], cfg["stages"]
    if cfg["cbuf"] not in (0, 1, 2):
        raise ValueError(f"CUDA fp8 GEMM: cbuf 0, 1 or 2, got {cfg['cbuf']!r}")
    if bn not in BLOCK_NS or stages < 2 or smem_bytes(bn, stages, cfg["cbuf"]) > SMEM_LIMIT:
        raise ValueError(f"CUDA fp8 GEMM: block_n one of {BLOCK_NS} and 2+ stages within "
                         f"{SMEM_LIMIT} bytes of shared memory, got {bn}, {stages}")
    if bn in ONE_PASS and (cfg["pipe"] or cfg["cluster"] != 1):
        raise ValueError(f"CUDA fp8 GEMM: a one-pass block_n ({bn}) takes no pipe and no "
                         "cluster")
    if cfg["pipe"] and (bn != 128 or cfg["cluster"] != 1):
        raise ValueError("CUDA fp8 GEMM: pipe needs block_n 128 (three 64-value accumulators) "
                         "and no cluster (it spills there)")
    if cfg["cluster"] not in (1, 2):
        raise ValueError(f"CUDA fp8 GEMM: cluster 1 or 2, got {cfg['cluster']!r}")
    if not (isinstance(cfg["group_m"], int) and cfg["group_m"] >= 1):
        raise ValueError(f"CUDA fp8 GEMM: group_m a positive int, got {cfg['group_m']!r}")
    return cfg


# one-pass widths' cost model: (c, f) per width, a tile costing K blocks x block_n / 256 x c +
# f in 256-wide-tile K-block times (a 256-wide tile: K blocks + 0, its narrow last column half
# of its K blocks). Fitted on the H100 (2026-12-07, benchmarks/RESULTS.md "Session 29": 13
# shapes, M 1024-8192, each width beside the shipped config); a width missing here is never
# chosen automatically.
ONE_PASS_COST: dict[int, tuple[float, float]] = {176: (1.03, 1.5), 192: (0.98, 0.75),
                                                 160: (1.07, 0.5), 144: (1.13, 0.25)}
ONE_PASS_STAGES = {144: 5, 160: 5, 176: 5, 192: 4}
# a one-pass width is considered only where 256-wide tiles leave a narrow last column (N % 256
# in (0, 128]: what it removes), and taken where the model gives it at most this much of 256's
# makespan. Where whole 256-wide columns only lose a wave count the model's gains did not
# appear: 2048 x 7168 x 16384, modelled 0.90 for 176, ran 9 % slower.
ONE_PASS_GAIN = 0.9


def makespan(m: int, n: int, k: int, block_n: int, sms: int,
             cost: tuple[float, float] | None = None) -> float:
    """The persistent grid's time in 256-wide-tile K-block units: tiles go to CTAs round-robin
    (tile t to CTA t % grid); see ONE_PASS_COST for a tile's cost (`cost` overrides it).
    Counted per CTA (at most `sms` of them), not per tile: it runs at every launch."""
    kb = -(-k // BLOCK)
    tiles_m, tiles_n = -(-m // BLOCK_M), -(-n // block_n)
    tiles = tiles_m * tiles_n
    if tiles == 0:
        return 0.0
    if block_n == 256:  # the narrow last column's tiles come last, at half the K blocks
        narrow = 0 < n % 256 <= 128
        wide, unit, tail = tiles_m * (tiles_n - narrow), float(kb), kb / 2
    else:
        c, f = cost or ONE_PASS_COST.get(block_n, (1.0, 0.0))
        wide, unit, tail = tiles, kb * block_n / 256 * c + f, 0.0
    grid = min(tiles, sms)

    def count(hi: int, i: int) -> int:  # tiles t < hi with t % grid == i
        return max(0, (hi - i + grid - 1) // grid)
    return max(count(wide, i) * unit + (count(tiles, i) - count(wide, i)) * tail
               for i in range(grid))


@functools.lru_cache(maxsize=256)
def choose_config(m: int, n: int, k: int, sms: int) -> dict:
    """CONFIG, or, where 256-wide tiles leave a narrow last column (N = 2112), the one-pass
    tile width (ONE_PASS_COST) with the shortest modelled makespan if that is at most
    ONE_PASS_GAIN of 256-wide tiles'. Cached per shape (a launch's host path; callers do not
    mutate the dict)."""
    if not 0 < n % 256 <= 128:
        return CONFIG
    best, best_t = CONFIG, ONE_PASS_GAIN * makespan(m, n, k, 256, sms)
    for bn in ONE_PASS_COST:
        t = makespan(m, n, k, bn, sms)
        if t <= best_t:
            best, best_t = {**CONFIG, "block_n": bn, "stages": ONE_PASS_STAGES[bn]}, t
    return best


def _tma_rows(t: torch.Tensor) -> torch.Tensor:
    """t [rows, K] e4m3 as TMA reads it: unit last stride, rows a multiple of 16 bytes apart,
    a 16-byte-aligned base; otherwise a zero-padded copy (zeros add nothing)."""
    if t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.stride(0) >= t.shape[1] and \
            t.data_ptr() % 16 == 0:
        return t
    k16 = -(-t.shape[1] // 16) * 16
    out = torch.zeros(t.shape[0], k16, dtype=t.dtype, device=t.device)
    out[:, :t.shape[1]] = t
    return out


_resident: dict[tuple, int] = {}


def resident_clusters(fn, smem: int, device: torch.device, cluster: int) -> int:
    """How many CTAs (cluster = 1) or CTA pairs fit on the device at once: the SM count, or for
    pairs the driver's cuOccupancyMaxActiveClusters (a pair must sit in one GPC, so an odd SM
    left in a GPC idles); half the SMs if the driver cannot answer."""
    sms = platform_of(device).num_sms
    if cluster == 1:
        return sms
    key = (device.index, fn, smem)
    if key not in _resident:
        cu = cuda_driver.driver()
        n = 0
        try:
            cfg = cu.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster * sms, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = THREADS, 1, 1
            cfg.sharedMemBytes = smem
            with torch.cuda.device(device):
                err, n = cu.cuOccupancyMaxActiveClusters(fn, cfg)
            if err != cu.CUresult.CUDA_SUCCESS:
                n = 0
        except Exception:  # older bindings: no such call or fields
            n = 0
        _resident[key] = int(n) if n else sms // cluster
    return _resident[key]


def run(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
        out: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """out [M, N] (bf16 / fp16 / fp32, unit last stride) = the block-scaled product of
    a [M, K] and b [N, K] (e4m3) with a_scale [M, ceil(K / 128)] and b_scale
    [ceil(N / 128), ceil(K / 128)] (float32). config: see CONFIG."""
    (m, k), n = a.shape, b.shape[0]
    if m == 0 or n == 0 or k == 0:  # before the tile choice: no tiles to place
        check_config(config)
        return out if m == 0 or n == 0 else out.zero_()
    if config is None and a.device.type == "cuda":
        config = choose_config(m, n, k, platform_of(a.device).num_sms)
    cfg = check_config(config)
    dev = a.device
    if dev.type != "cuda" or out.stride(1) != 1:
        raise ValueError("CUDA fp8 GEMM: CUDA tensors and an output with unit last stride")
    bn, stages, cl = cfg["block_n"], cfg["stages"], cfg["cluster"]
    a, b = _tma_rows(a), _tma_rows(b)
    a_scale, b_scale = a_scale.float().contiguous(), b_scale.float().contiguous()
    smem = smem_bytes(bn, stages, cfg["cbuf"])
    opts = nvcc_options(bn, stages, cfg["pipe"], out.dtype, cl, cfg["cbuf"]) + \
        tuple(cfg.get("extra", ()))
    fn = cuda_driver.sm90a_function(dev, SOURCE, KERNEL, opts, smem, "CUDA fp8 block GEMM")
    amap = cuda_driver.tensor_map_2d(a, m, k, a.stride(0), BLOCK_M, box_cols=BLOCK)
    bmap = cuda_driver.tensor_map_2d(b, n, k, b.stride(0), bn // cl, box_cols=BLOCK)
    tiles_m, tiles_n = -(-m // BLOCK_M), -(-n // bn)
    # persistent: no more CTAs (pairs) than can be resident at once
    items = -(-tiles_m // cl) * tiles_n
    grid = cl * min(items, resident_clusters(fn, smem, dev, cl))
    vec2 = out.stride(0) % 2 == 0 and out.data_ptr() % (2 * out.element_size()) == 0
    # TMA-store epilogue: 16-bit c, rows 16-byte aligned (else direct stores from registers)
    tma_c = cfg["cbuf"] > 0 and out.element_size() == 2 and out.stride(0) % 8 == 0 and \
        out.data_ptr() % 16 == 0
    cmap = cuda_driver.tensor_map_2d(out, m, n, out.stride(0) * 2, 64) if tma_c else amap
    args = (amap, bmap, cmap, ctypes.c_uint64(a_scale.data_ptr()), ctypes.c_uint64(b_scale.data_ptr()),
            ctypes.c_uint64(out.data_ptr()), ctypes.c_int(m), ctypes.c_int(n),
            ctypes.c_int(-(-k // BLOCK)), ctypes.c_int64(out.stride(0)),
            ctypes.c_int64(a_scale.stride(0)), ctypes.c_int64(b_scale.stride(0)),
            ctypes.c_int(tiles_m), ctypes.c_int(tiles_n), ctypes.c_int(cfg["group_m"]),
            ctypes.c_int(int(0 < n % bn <= bn // 2 and bn == 256)),
            ctypes.c_int(int(vec2)), ctypes.c_int(int(tma_c)))
    cuda_driver.launch(fn, grid, THREADS, smem, dev, args)
    return out


@register("gemm", "fp8_block_mm", backend="cuda_sm90",
          capability=Capability(vendors=frozenset({"nvidia"}), min_sm=90, max_sm=90,
                                features=frozenset({"wgmma", "tma", "fp8"}),
                                modules=frozenset({"cuda.bindings"})),
          formats={"a": ("fp8_e4m3",), "b": ("fp8_e4m3",), "c": ("bf16", "fp16", "fp32")},
          traits={"block": (BLOCK,)}, prefer={"large_m": (True,)}, band="specialized",
          tags=("deterministic",), compiled=("sm_90",),
          description="CUDA block-fp8 GEMM (wgmma e4m3 + TMA, sm_90a): producer warpgroup, two "
                      "consumer warpgroups alternating MMA and scale promotion; above 64 rows.")
def fp8_block_mm(a, a_scale, b, b_scale, *, out_dtype, block):
    """CUDA block-fp8 GEMM (sm_90a), persistent [128 x 128] tiles."""
    out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
    return run(a, a_scale, b, b_scale, out)
