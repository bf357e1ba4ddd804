// 16-bit GEMM for Blackwell (sm_100a / sm_103a) on CTA pairs: c [M, N] = a [M, K] @ b [N, K]^T,
// fp32 accumulation in tensor memory, c in bf16 or fp16 (-DOUT_F16).
// COMPILED, NOT RUN: no Blackwell hardware was available; every layout below is the PTX ISA's.
//
// A cluster of 2 CTAs owns one [256 x 256] tile of c and runs it as m256n256k16 MMAs with
// cta_group::2: CTA r (its cluster rank) holds rows 128 r ... 128 r + 127 of the tile's a and
// rows 128 r ... of its b (the MMA's N half r) in its own shared memory, and its 128 rows of
// the accumulator in its own tensor memory. Why it pays: per CTA and K step of 64 the ring
// takes 32 KB (a 16 KB + half of b 16 KB) for a 128 x 256 slice, against 48 KB in the
// one-CTA kernel (gemm_tcgen05.cu): a third less L2 -> shared memory traffic per MMA, and seven
// stages (224 KB) where that kernel fits four. 192 threads per CTA:
//  * warp 0, producer (both CTAs): TMA copies of its a rows and b half into its own ring; the
//    bytes complete on the even CTA's "full" barrier (cta_group::2 copies), which expects
//    both CTAs' bytes; a stage is refilled once the pair's MMAs released it (its own "empty"
//    barrier, arrived on by the even CTA's multicast commit);
//  * warp 1, MMA (the even CTA issues, one lane): 4 x m256n256k16 per stage, commits
//    multicast to both CTAs' "empty" barrier, finally to both "accumulator done" barriers;
//    both CTAs' warp 1 allocate / free the pair's 256 TMEM columns (cta_group::2);
//  * warps 2-5, epilogue (both CTAs): thread t reads its row of its CTA's accumulator 32
//    columns at a time (tcgen05.ld) and stores it (16-byte stores, rows / columns past c
//    skipped).
// Cluster barriers after the barrier setup (the peer's barriers exist before anyone signals
// them) and before the teardown (no CTA frees its memory while the pair may still use it).

#ifdef FP16
#define IS_BF16 false
#define DT "f16"          // (hopper_common.cuh's wgmma / pack helpers, unused here)
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
#define BM 128                             // rows of a per CTA (the pair's tile: 256)
#define BN 256                             // columns of c per tile (MMA N)
#define BN_HALF 128                        // rows of b per CTA
#define BK 64
#define STAGES 7
#define A_BYTES (BM * BK * 2)              // 16 KB
#define B_BYTES (BN_HALF * BK * 2)         // 16 KB
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

// amap: a as a 2-D [M, K] tensor, boxes of 64 columns x 128 rows; bmap: b [N, K], 64 x 128.
// c [M, N] with row stride ldc (elements, a multiple of 8).
// Grid: (2 ceil(M / 256), ceil(N / 256)), clusters of (2, 1, 1): blockIdx.x / 2 is the pair.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
gemm_tcgen05_2cta_kernel(const __grid_constant__ TensorMap amap,
                         const __grid_constant__ TensorMap bmap, u16* __restrict__ c, int M,
                         int N, int K, long ldc) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 bars = base + BAR_OFFSET;
    const u32 full = bars, empty = bars + 8 * STAGES, acc = bars + 16 * STAGES;
    const u32 slot = acc + 8;
    const u32* tmem_slot = (const u32*)(smem_raw + (slot - smem_addr(smem_raw)));
    const u32 rank = cluster_rank();
    const int m0 = (blockIdx.x >> 1) * (2 * BM) + rank * BM;  // this CTA's rows of a and c
    const int n0 = blockIdx.y * BN;                           // the tile's columns of c
    const int kt = (K + BK - 1) / BK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);   // the even CTA's producer lane (+ both CTAs' bytes)
            mbar_init(empty + 8 * s, 1);  // the pair's commit after the stage's MMAs
        }
        mbar_init(acc, 1);                // the pair's commit after the last MMA
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (warp == 1) tmem_alloc_pair<TMEM_COLS>(slot);
    tc_fence_before();
    __syncthreads();
    cluster_sync();
    tc_fence_after();
    const u32 tmem = *tmem_slot;

    if (warp == 0) {  // ---- producer (both CTAs) ----
        if (lane == 0) {
            const u32 full0 = cluster_map(full, 0);  // the even CTA's "full" barriers
            for (int j = 0; j < kt; ++j) {
                const int s = j % STAGES;
                if (j >= STAGES) mbar_wait_uniform(empty + 8 * s, ((j / STAGES) - 1) & 1);
                const u32 dst = base + s * STAGE_BYTES;
                // the full boxes of both CTAs: TMA counts zero-filled out-of-bounds bytes too
                if (rank == 0) mbar_expect_tx(full + 8 * s, 2 * STAGE_BYTES);
                tma_load_pair(dst, &amap, j * BK, m0, full0 + 8 * s);
                tma_load_pair(dst + A_BYTES, &bmap, j * BK, n0 + rank * BN_HALF, full0 + 8 * s);
            }
        }
        __syncwarp();
    } else if (warp == 1) {  // ---- MMA issuer: the even CTA's lane 0 ----
        if (rank == 0 && lane == 0) {
            constexpr u32 ID = umma_idesc_f16(2 * BM, BN, IS_BF16, false);
            for (int j = 0; j < kt; ++j) {
                const int s = j % STAGES;
                mbar_wait_uniform(full + 8 * s, (j / STAGES) & 1);
                tc_fence_after();
                const u32 sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk)
                    umma_ss_pair(tmem, umma_desc(sa + 32 * kk, 16, 1024, true),
                                 umma_desc(sb + 32 * kk, 16, 1024, true), ID, j > 0 || kk > 0);
                umma_commit_pair(empty + 8 * s, 0x3);
            }
            umma_commit_pair(acc, 0x3);
        }
        __syncwarp();
    } else {  // ---- epilogue: warps 2..5 of both CTAs, one row of c per thread ----
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
    cluster_sync();
    if (warp == 1) {
        tc_fence_after();
        tmem_dealloc_pair<TMEM_COLS>(tmem);
    }
#else
    asm volatile("trap;\n");  // built without sm_100a features: fail loudly, never return zeros
#endif
}
