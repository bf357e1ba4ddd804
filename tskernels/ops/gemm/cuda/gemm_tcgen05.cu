// 16-bit GEMM for Blackwell (sm_100a / sm_103a): c [M, N] = a [M, K] @ b [N, K]^T (the
// nn.Linear layout), fp32 accumulation in tensor memory, c in bf16 or fp16 (-DOUT_F16).
// COMPILED, NOT RUN: no Blackwell hardware was available; every layout below is the PTX ISA's.
//
// One CTA per [128 x 256] tile of c (the largest cta_group::1 MMA, m128n256k16), K in steps of
// 64 through a 4-stage ring (48 KB a stage: a [128 x 64] and b [256 x 64] boxes, 128-byte
// swizzle), 192 threads:
//  * warp 0, producer: TMA copies of both operands into the ring (rows past M / N and columns
//    past K read as zeros: no bounds logic in the MMA);
//  * warp 1, MMA: allocates 256 TMEM columns (the accumulator: row i in lane i) and from one
//    lane issues 4 x m128n256k16 per stage; tcgen05.commit releases each stage and finally
//    signals "accumulator done";
//  * warps 2-5, epilogue: thread t reads its row of the accumulator 32 columns at a time
//    (tcgen05.ld), converts and stores them (16-byte stores, rows / columns past c skipped).
// Not persistent, no 2-CTA pairs and no epilogue overlap: the simplest correct shape, to be
// tuned on hardware (persistent tile scheduler with a double-buffered accumulator, cta_group::2
// with multicast b, as the Hopper-class libraries do).

#ifdef FP16
#define IS_BF16 false
#define DT "f16"          // (hopper_common.cuh's wgmma wrappers, unused here)
#define CVT_PACK "cvt.rn.f16x2.f32"
#else
#define IS_BF16 true
#define DT "bf16"
#define CVT_PACK "cvt.rn.bf16x2.f32"
#endif
#ifdef OUT_F16
#define CVT_OUT "cvt.rn.f16x2.f32"
#else
#define CVT_OUT "cvt.rn.bf16x2.f32"
#endif
#define BM 128
#define BN 256
#define BK 64
#define STAGES 4
#define A_BYTES (BM * BK * 2)              // 16 KB
#define B_BYTES (BN * BK * 2)              // 32 KB
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define BAR_OFFSET (STAGES * STAGE_BYTES)  // full[S], empty[S], acc, tmem slot
#define SMEM_BYTES (BAR_OFFSET + 128 + 1024)
#define TMEM_COLS 256
#define THREADS 192

#include "blackwell_common.cuh"

__device__ __forceinline__ u32 pack_out(float lo, float hi) {
    u32 d;
    asm(CVT_OUT " %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// amap: a as a 2-D [M, K] tensor, boxes of 64 columns x 128 rows; bmap: b [N, K], 64 x 256.
// c [M, N] with row stride ldc (elements, a multiple of 8). Grid: (ceil(N / 256), ceil(M / 128)).
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_tcgen05_kernel(const __grid_constant__ TensorMap amap,
                    const __grid_constant__ TensorMap bmap, u16* __restrict__ c, int M, int N,
                    int K, long ldc) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 bars = base + BAR_OFFSET;
    const u32 full = bars, empty = bars + 8 * STAGES, acc = bars + 16 * STAGES;
    const u32 slot = acc + 8;
    const u32* tmem_slot = (const u32*)(smem_raw + (slot - smem_addr(smem_raw)));
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int kt = (K + BK - 1) / BK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);   // the TMA lane (+ bytes)
            mbar_init(empty + 8 * s, 1);  // tcgen05.commit after the stage's MMAs
        }
        mbar_init(acc, 1);                // tcgen05.commit after the last MMA
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (warp == 1) tmem_alloc<TMEM_COLS>(slot);
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
    const u32 tmem = *tmem_slot;

    if (warp == 0) {  // ---- producer ----
        if (lane == 0) {
            for (int j = 0; j < kt; ++j) {
                const int s = j % STAGES;
                if (j >= STAGES) mbar_wait_uniform(empty + 8 * s, ((j / STAGES) - 1) & 1);
                const u32 dst = base + s * STAGE_BYTES, bar = full + 8 * s;
                // the full boxes' bytes: TMA counts zero-filled out-of-bounds elements too
                mbar_expect_tx(bar, STAGE_BYTES);
                tma_load(dst, &amap, j * BK, m0, bar);
                tma_load(dst + A_BYTES, &bmap, j * BK, n0, bar);
            }
        }
        __syncwarp();
    } else if (warp == 1) {  // ---- MMA issuer (one lane) ----
        if (lane == 0) {
            constexpr u32 ID = umma_idesc_f16(BM, BN, IS_BF16, false);
            for (int j = 0; j < kt; ++j) {
                const int s = j % STAGES;
                mbar_wait_uniform(full + 8 * s, (j / STAGES) & 1);
                tc_fence_after();
                const u32 sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk)
                    umma_ss(tmem, umma_desc(sa + 32 * kk, 16, 1024, true),
                            umma_desc(sb + 32 * kk, 16, 1024, true), ID, j > 0 || kk > 0);
                umma_commit(empty + 8 * s);
            }
            umma_commit(acc);
        }
        __syncwarp();
    } else {  // ---- epilogue: warps 2..5, one row of c per thread ----
        const int row = 32 * (warp & 3) + lane, m = m0 + row;
        const u32 taddr = tmem + ((u32)(32 * (warp & 3)) << 16);
        mbar_wait_uniform(acc, 0);
        tc_fence_after();
        float v[32];
#pragma unroll 1
        for (int cc = 0; cc < BN / 32; ++cc) {
            tmem_ld32(taddr + 32 * cc, v);  // (warp-collective: every row loads)
            tmem_wait_ld();
            const int n = n0 + 32 * cc;
            if (m >= M || n >= N) continue;
            u16* dst = c + (long)m * ldc + n;
#pragma unroll
            for (int i = 0; i < 32; i += 8)
                if (n + i < N)  // N is a multiple of 8: a group of 8 is all in or all out
                    *(uint4*)(dst + i) = make_uint4(pack_out(v[i], v[i + 1]),
                                                    pack_out(v[i + 2], v[i + 3]),
                                                    pack_out(v[i + 4], v[i + 5]),
                                                    pack_out(v[i + 6], v[i + 7]));
        }
    }
    tc_fence_before();
    __syncthreads();
    if (warp == 1) {
        tc_fence_after();
        tmem_dealloc<TMEM_COLS>(tmem);
    }
#else
    asm volatile("trap;\n");  // built without sm_100a features: fail loudly, never return zeros
#endif
}
