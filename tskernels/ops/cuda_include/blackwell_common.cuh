// Helpers of the hand-written Blackwell (sm_100a / sm_103a) kernels: the 5th-generation tensor
// core (tcgen05: MMAs that accumulate in tensor memory, TMEM allocation, TMEM <-> register
// copies, completion through mbarriers) and its shared-memory / instruction descriptors. The
// mbarrier, TMA and swizzle helpers are Hopper's (hopper_common.cuh): the same PTX on sm_100.
//
// Tensor memory: 128 lanes x 512 columns of 32 bits per SM. An address is (lane << 16) | column;
// a warp may only touch the 32 lanes of its sub-partition, lanes 32 (warp % 4) ... + 31. An
// M = 128 cta_group::1 accumulator puts row i in lane i, column j in column (base + j).
#pragma once

#include "hopper_common.cuh"

// ---- allocation (one warp, .sync.aligned): the column count is a power of two >= 32 ----
template <int NCOLS>
__device__ __forceinline__ void tmem_alloc(u32 slot_smem) {
    static_assert(NCOLS >= 32 && NCOLS <= 512 && (NCOLS & (NCOLS - 1)) == 0, "TMEM columns");
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                 :: "r"(slot_smem), "n"(NCOLS) : "memory");
    // this CTA allocates once: let a co-resident CTA's allocation proceed
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
template <int NCOLS>
__device__ __forceinline__ void tmem_dealloc(u32 taddr) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n"
                 :: "r"(taddr), "n"(NCOLS) : "memory");
}

// ordering of tcgen05 operations around thread synchronisation (barriers, mbarrier waits)
__device__ __forceinline__ void tc_fence_before() {
    asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
}
__device__ __forceinline__ void tc_fence_after() {
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
}

// ---- descriptors ----
// shared-memory matrix descriptor of tcgen05: start >> 4 (bits 0-13), leading byte offset >> 4
// (16-29), stride byte offset >> 4 (32-45), version 1 (bits 46-47, new with sm_100), base
// offset 0 (the operands start 1024-byte aligned), swizzle mode in bits 61-63 (2: 128-byte,
// 0: none, the 8 x 16-byte "core matrix" interleave)
__device__ __forceinline__ u64 umma_desc(u32 addr, u32 lbo, u32 sbo, bool swizzle128) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 46) | ((swizzle128 ? 2ull : 0ull) << 61);
}
// instruction descriptor of .kind::f16 with an f32 accumulator: A / B 16-bit (bf16 = 1 or
// f16 = 0 in bits 7-9 / 10-12), B's major-ness (bit 16: 1 = N-major), N >> 3 (bits 17-22),
// M >> 4 (bits 24-28); dense, no negation, A K-major
__host__ __device__ constexpr u32 umma_idesc_f16(int m, int n, bool bf16, bool b_mn_major) {
    return (1u << 4) | ((bf16 ? 1u : 0u) << 7) | ((bf16 ? 1u : 0u) << 10) |
           ((b_mn_major ? 1u : 0u) << 16) | ((u32)(n >> 3) << 17) | ((u32)(m >> 4) << 24);
}

// ---- MMA (issued by one thread) and its completion ----
// d[tmem] (+)= A[smem] * B[smem] with the shape and types of `idesc`; accumulate 0 overwrites
__device__ __forceinline__ void umma_ss(u32 d_tmem, u64 da, u64 db, u32 idesc, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n"
                 :: "r"(d_tmem), "l"(da), "l"(db), "r"(idesc), "r"(accumulate) : "memory");
}
// the mbarrier gets one arrival once every tcgen05.mma this thread issued so far completed
__device__ __forceinline__ void umma_commit(u32 bar) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
                 :: "r"(bar) : "memory");
}

// ---- TMEM <-> registers: 32 lanes (this warp's) x 32 consecutive columns, one lane per
// thread (thread t holds row 32 (warp % 4) + t, columns col ... col + 31) ----
__device__ __forceinline__ void tmem_ld32(u32 taddr, float* v) {
    u32* r = reinterpret_cast<u32*>(v);
    asm volatile(
        "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,"
        "%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, [%32];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]),
          "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]),
          "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]), "=r"(r[17]), "=r"(r[18]),
          "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]),
          "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]),
          "=r"(r[31])
        : "r"(taddr) : "memory");
}
__device__ __forceinline__ void tmem_st32(u32 taddr, const float* v) {
    const u32* r = reinterpret_cast<const u32*>(v);
    asm volatile(
        "tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,"
        "%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32};\n"
        :: "r"(taddr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]),
           "r"(r[6]), "r"(r[7]), "r"(r[8]), "r"(r[9]), "r"(r[10]), "r"(r[11]), "r"(r[12]),
           "r"(r[13]), "r"(r[14]), "r"(r[15]), "r"(r[16]), "r"(r[17]), "r"(r[18]), "r"(r[19]),
           "r"(r[20]), "r"(r[21]), "r"(r[22]), "r"(r[23]), "r"(r[24]), "r"(r[25]), "r"(r[26]),
           "r"(r[27]), "r"(r[28]), "r"(r[29]), "r"(r[30]), "r"(r[31])
        : "memory");
}
// the register values of every tcgen05.ld / the TMEM writes of every tcgen05.st issued so far
__device__ __forceinline__ void tmem_wait_ld() {
    asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tmem_wait_st() {
    asm volatile("tcgen05.wait::st.sync.aligned;\n" ::: "memory");
}

// ---- CTA pairs (cta_group::2): a cluster of 2 CTAs on neighbouring SMs runs one MMA of
// M = 256 (each CTA's tensor memory holds its 128 rows), A rows and the halves of B's columns
// read from the shared memory of both CTAs at the same offsets. Alloc / dealloc are done by
// one warp in each CTA of the pair; the MMA and its commits by one thread of the even CTA. ----
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// every thread of both CTAs: the peer's barriers are initialised / its work is done
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// the shared::cluster address of `addr` (this CTA's shared memory) in CTA `rank`'s window
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank) {
    u32 d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(addr), "r"(rank));
    return d;
}
template <int NCOLS>
__device__ __forceinline__ void tmem_alloc_pair(u32 slot_smem) {
    static_assert(NCOLS >= 32 && NCOLS <= 512 && (NCOLS & (NCOLS - 1)) == 0, "TMEM columns");
    asm volatile("tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%0], %1;\n"
                 :: "r"(slot_smem), "n"(NCOLS) : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;\n" ::: "memory");
}
template <int NCOLS>
__device__ __forceinline__ void tmem_dealloc_pair(u32 taddr) {
    asm volatile("tcgen05.dealloc.cta_group::2.sync.aligned.b32 %0, %1;\n"
                 :: "r"(taddr), "n"(NCOLS) : "memory");
}
__device__ __forceinline__ void umma_ss_pair(u32 d_tmem, u64 da, u64 db, u32 idesc,
                                             int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::2.kind::f16 [%0], %1, %2, %3, p;\n}\n"
                 :: "r"(d_tmem), "l"(da), "l"(db), "r"(idesc), "r"(accumulate) : "memory");
}
// one arrival on the barrier at this offset in every CTA of `cta_mask` once the pair's MMAs
// issued so far completed
__device__ __forceinline__ void umma_commit_pair(u32 bar, unsigned short cta_mask) {
    asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster"
                 ".multicast::cluster.b64 [%0], %1;\n" :: "r"(bar), "h"(cta_mask) : "memory");
}
// a TMA copy into this CTA's shared memory whose bytes complete on `bar`, a shared::cluster
// address that may lie in the peer CTA (the pair's MMA-issuing CTA counts both halves)
__device__ __forceinline__ void tma_load_pair(u32 dst, const TensorMap* map, int col, int row,
                                              u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global.tile"
                 ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"((u64)map), "r"(col), "r"(row), "r"(bar) : "memory");
}
