// Absorbed-MLA decode for Blackwell (sm_100a / sm_103a): 5th-generation tensor-core MMAs
// (tcgen05) accumulating in tensor memory, fed by TMA through an mbarrier ring. The op is the
// Hopper kernel's (mla_decode_wgmma.cu): one query token per request; each cache row is
// [c_kv (512) | k_rope (64)], shared by all heads; o = softmax(c * q . row) @ rows[:, :512].
// 16-bit q and cache (bf16, or fp16 with -DFP16), or an fp8-e4m3 latent cache (-DFP8KV,
// converted to f16 in shared memory: kind::f16 needs A and B of one type and q stays 16-bit).
// COMPILED, NOT RUN: no Blackwell hardware was available; every layout below is the PTX ISA's.
//
// Shape of the work (why it differs from Hopper): an M = 128 accumulator puts one head per
// TMEM lane, but [128 heads x 512] fp32 alone fills all 512 TMEM columns, leaving none for the
// logits. So a CTA owns 128 heads x one half (256) of the output columns: O [128 x 256] in
// columns 0..255, the logits of two tiles (S, [128 x 32] each) in 256..319 (512 allocated: a
// power of two, and the 225 KB of shared memory keep one CTA per SM anyway). Both halves
// recompute the logits (576 of the 832 MMA columns per key; the 2-CTA pair that shares them,
// cta_group::2 with the P exchange through distributed shared memory, is the next step and was
// not written without hardware to run it). The Q block [128 x 576] takes 144 KB of shared
// memory, so tiles are 32 keys (36 KB per stage, 2 stages) and P [128 x 32] 8 KB.
//
// CTA = 192 threads (320 with -DFP8KV), one (request, 128-head block, column half, KV split):
//  * warp 0, producer: TMA copies of 32-row tiles (9 boxes of [32 rows x 64 columns], 128-byte
//    swizzle) into the 2-stage ring; a partial last tile goes as 1-row boxes;
//  * warp 1, MMA: allocates TMEM (512 columns) and, from one lane, issues S(j+1) = Q K^T
//    (36 x m128n32k16, both from shared memory) before O += P(j) V(j) (2 x m128n256k16, P from
//    shared memory, V N-major); tcgen05.commit signals "S ready", "stage free", "O updated";
//  * warps 2-5, softmax / correction / epilogue: thread t owns head row 32 (warp % 4) + lane,
//    reads its row of S with tcgen05.ld (no shuffles: a row is one thread's), keeps the running
//    max lazily (O is rescaled in TMEM, ld -> scale -> st, only when a warp's max grew by more
//    than 2^8: p <= 256 is exact enough in 16 bits, and the final division uses the same max),
//    writes P as 16-bit to shared memory, and at the end reads O back to normalise and store;
//  * -DFP8KV, warps 6-9: convert each e4m3 tile to f16 in place (the Hopper kernel's scheme).
//  * splits: partial o (fp32) and log-sum-exp go to a workspace, merged by the attention
//    family's merge kernel, exactly as for the Hopper kernel.

#if defined(FP16) || defined(FP8KV)
#define IS_BF16 false
#define DT "f16"  // (hopper_common.cuh's wgmma wrappers, unused here)
#define CVT_PACK "cvt.rn.f16x2.f32"
#else
#define IS_BF16 true
#define DT "bf16"
#define CVT_PACK "cvt.rn.bf16x2.f32"
#endif
#if defined(FP16) || (defined(FP8KV) && defined(QF16))  // the output's (q's) type
#define CVT_OUT "cvt.rn.f16x2.f32"
#else
#define CVT_OUT "cvt.rn.bf16x2.f32"
#endif
#define DC 512                      // latent width (the output's)
#define DW 576                      // row width: latent + rope
#define NCH 9                       // 64-column chunks per row
#define HM 128                      // heads per CTA (the MMA's M)
#define BN 32                       // keys per tile (the logits MMA's N)
#define DV 256                      // output columns per CTA
#define QCHUNK (HM * 128)           // [128 rows x 64 columns] 16-bit, 128-byte rows: 16 KB
#define KCHUNK (BN * 128)           // [32 rows x 64 columns]: 4 KB
#define Q_BYTES (NCH * QCHUNK)      // 144 KB
#define STAGE_BYTES (NCH * KCHUNK)  // 36 KB
#define P_OFFSET (Q_BYTES + 2 * STAGE_BYTES)
#define P_BYTES (HM * BN * 2)       // 8 KB, core-matrix interleave (no swizzle)
#define BAR_OFFSET (P_OFFSET + P_BYTES)
// full[2], empty[2], s_full[2], s_free[2], p_full, o_done, q_full, conv[2], tmem slot
#define SMEM_BYTES (BAR_OFFSET + 128 + 1024)
#define TMEM_COLS 512
#define S_COL 256                   // the two logits buffers: columns 256 and 288
#define LAZY 8.0f                   // rescale O only when the max grew by more than 2^8
#define BOX8 (BN * 192)             // fp8: one [32 rows x 192 bytes] TMA box
#define FP8_OFFSET (STAGE_BYTES / 2)
#ifdef FP8KV
#define THREADS 320                 // + 4 converter warps (warps 6-9)
#else
#define THREADS 192
#endif

#include "blackwell_common.cuh"

__device__ __forceinline__ u32 pack_out(float lo, float hi) {
    u32 d;
    asm(CVT_OUT " %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

#ifdef FP8KV
// e4m3 tile -> f16 chunks (the Hopper kernel's in-place order, for 32-row boxes): box x holds
// columns 192x ... 192x + 191 of the 32 rows, 384 16-byte units, unit u = row u / 12; converter
// thread t takes units t, t + 128, t + 256. Rows past the request read as zeros.
__device__ __forceinline__ void load_box(uint4* v, u32 box, int t, int rows) {
#pragma unroll
    for (int m = 0; m < 3; ++m) {
        const int u = t + 128 * m;
        if (u / 12 < rows)
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[m].x), "=r"(v[m].y), "=r"(v[m].z), "=r"(v[m].w)
                         : "r"(box + 16 * u) : "memory");
        else
            v[m] = make_uint4(0u, 0u, 0u, 0u);
    }
}
__device__ __forceinline__ void store_box(const uint4* v, u32 stage, int t, int box) {
#pragma unroll
    for (int m = 0; m < 3; ++m) {
        const int u = t + 128 * m, r = u / 12, c = box * 192 + (u % 12) * 16;
        const u32 w[4] = {v[m].x, v[m].y, v[m].z, v[m].w};
        u32 f[8];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\n"
                "cvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
                : "=r"(f[2 * k]), "=r"(f[2 * k + 1]) : "r"(w[k]));
        const u32 chunk = stage + (c >> 6) * KCHUNK;
#pragma unroll
        for (int h = 0; h < 2; ++h)
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                         :: "r"(swz(chunk, r, ((c & 63) >> 3) + h)), "r"(f[4 * h]),
                            "r"(f[4 * h + 1]), "r"(f[4 * h + 2]), "r"(f[4 * h + 3])
                         : "memory");
    }
}
#endif

// kvmap / kvmap1: the latent cache as a 2-D [pages * page_size, 576] tensor, boxes of 64
// columns x 32 rows / x 1 row (fp8: 192 bytes x 32 rows, unswizzled; kvmap1 unused). q [B, H,
// 576] (strides q_st, q_sh), o [B, H, 512] (o_st, o_sh); num_splits > 1: po [B * H * num_splits,
// 512] fp32 and plse [B * H * num_splits] instead. Grid: B x ceil(H / 128) x 2 x num_splits.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
mla_decode_tcgen05_kernel(const __grid_constant__ TensorMap kvmap,
                          const __grid_constant__ TensorMap kvmap1,
                          const u16* __restrict__ q, u16* __restrict__ o,
                          float* __restrict__ po, float* __restrict__ plse,
                          const int* __restrict__ seq_lens, const int* __restrict__ page_table,
                          const float* __restrict__ kv_scale, float c, int H, int num_splits,
                          int page_shift, long q_st, long q_sh, long o_st, long o_sh, long pt_st,
                          const unsigned char* __restrict__ kv8) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 sq = base, skv = base + Q_BYTES, sp = base + P_OFFSET, bars = base + BAR_OFFSET;
    const u32 full = bars, empty = bars + 16, s_full = bars + 32, s_free = bars + 48;
    const u32 p_full = bars + 64, o_done = bars + 72, q_full = bars + 80;
#ifdef FP8KV
    const u32 conv = bars + 88;  // e4m3 bytes landed (the converters then fill `full`)
#endif
    const u32 slot = bars + 104;
    const u32* tmem_slot = (const u32*)(smem_raw + (slot - smem_addr(smem_raw)));

    const int hb_count = (H + HM - 1) / HM;
    const int pid = blockIdx.x;
    const int hb = pid % hb_count, half = (pid / hb_count) & 1;
    const int split = (pid / (2 * hb_count)) % num_splits;
    const int b = pid / (2 * hb_count * num_splits);
    const int h0 = hb * HM, hrows = min(HM, H - h0), col0 = half * DV;
    const int L = seq_lens[b];
    const int tiles = (L + BN - 1) / BN, per = (tiles + num_splits - 1) / num_splits;
    const int t0 = split * per, n = min(tiles, t0 + per) - t0;  // this CTA's tiles
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    if (n <= 0) {  // nothing to attend (empty request or split): o = 0, lse = -inf
        for (int i = tid; i < hrows * DV / 2; i += THREADS) {
            const int r = i / (DV / 2), col = col0 + 2 * (i % (DV / 2));
            if (num_splits == 1)
                *(u32*)(o + (long)b * o_st + (long)(h0 + r) * o_sh + col) = 0u;
            else
                *(float2*)(po + ((long)(b * H + h0 + r) * num_splits + split) * DC + col) =
                    make_float2(0.f, 0.f);
        }
        if (num_splits > 1 && half == 0 && tid < hrows)
            plse[(long)(b * H + h0 + tid) * num_splits + split] = NEG_INF;
        return;
    }

    if (tid == 0) {
        for (int s = 0; s < 2; ++s) {
#ifdef FP8KV
            mbar_init(full + 8 * s, 128);   // the converter warps
            mbar_init(conv + 8 * s, 1);     // the TMA lane (+ bytes)
#else
            mbar_init(full + 8 * s, 1);     // the TMA lane (+ bytes)
#endif
            mbar_init(empty + 8 * s, 1);    // tcgen05.commit after O += P V of the stage
            mbar_init(s_full + 8 * s, 1);   // tcgen05.commit after S
            mbar_init(s_free + 8 * s, 128); // softmax threads read S
        }
        mbar_init(p_full, 128);             // softmax threads wrote P (and corrected O)
        mbar_init(o_done, 1);               // tcgen05.commit after O += P V
        mbar_init(q_full, 128);             // the Q block is in shared memory
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // a stage's rows that a partial tile does not load must be finite (p = 0 there)
    for (int i = tid; i < 2 * STAGE_BYTES / 16; i += THREADS)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n"
                     :: "r"(skv + 16 * i), "r"(0) : "memory");
    fence_async_shared();
    if (warp == 1) tmem_alloc<TMEM_COLS>(slot);
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
    const u32 tmem = *tmem_slot;

    if (warp == 0) {  // ---- producer ----
        const int* pt = page_table + (long)b * pt_st;
        const int pmask = (1 << page_shift) - 1;
        for (int j = 0; j < n; ++j) {
            const int s = j & 1;
            if (j >= 2) mbar_wait_uniform(empty + 8 * s, ((j >> 1) - 1) & 1);
            const int k0 = (t0 + j) * BN, rows = min(BN, L - k0);
            // a tile never crosses a page (BN divides the page sizes): consecutive cache rows
            const int row0 = (pt[k0 >> page_shift] << page_shift) + (k0 & pmask);
            const u32 dst = skv + s * STAGE_BYTES;
#ifdef FP8KV
            const u32 bar = conv + 8 * s;
            if (lane == 0) mbar_expect_tx(bar, rows * DW);
            __syncwarp();
            if (rows == BN) {
                if (lane < 3)
                    tma_load(dst + FP8_OFFSET + lane * BOX8, &kvmap, lane * 192, row0, bar);
            } else {  // per row, 3 bulk copies of 192 bytes (16-byte aligned in the box)
                for (int r = lane; r < rows; r += 32)
                    for (int x = 0; x < 3; ++x)
                        asm volatile("cp.async.bulk.shared::cluster.global"
                                     ".mbarrier::complete_tx::bytes [%0], [%1], 192, [%2];\n"
                                     :: "r"(dst + FP8_OFFSET + x * BOX8 + r * 192),
                                        "l"(kv8 + (long)(row0 + r) * DW + x * 192), "r"(bar)
                                     : "memory");
            }
#else
            const u32 bar = full + 8 * s;
            if (lane == 0) mbar_expect_tx(bar, rows * DW * 2);
            __syncwarp();
            if (rows == BN) {
                if (lane < NCH) tma_load(dst + lane * KCHUNK, &kvmap, lane * 64, row0, bar);
            } else {
                for (int r = lane; r < rows; r += 32)
#pragma unroll
                    for (int ch = 0; ch < NCH; ++ch)
                        tma_load(dst + ch * KCHUNK + r * 128, &kvmap1, ch * 64, row0 + r, bar);
            }
#endif
        }
    } else if (warp == 1) {  // ---- MMA issuer (one lane) ----
        if (lane == 0) {
            constexpr u32 ID_S = umma_idesc_f16(HM, BN, IS_BF16, false);
            constexpr u32 ID_O = umma_idesc_f16(HM, DV, IS_BF16, true);
            mbar_wait_uniform(q_full, 0);
            for (int j = 0; j <= n; ++j) {
                tc_fence_after();
                if (j < n) {  // S(j) into buffer j % 2, once the softmax read S(j - 2)
                    const int s = j & 1;
                    mbar_wait_uniform(full + 8 * s, (j >> 1) & 1);
                    if (j >= 2) mbar_wait_uniform(s_free + 8 * s, ((j >> 1) - 1) & 1);
                    tc_fence_after();
                    const u32 sk = skv + s * STAGE_BYTES;
#pragma unroll
                    for (int i = 0; i < 4 * NCH; ++i)
                        umma_ss(tmem + S_COL + BN * s,
                                umma_desc(sq + (i >> 2) * QCHUNK + (i & 3) * 32, 16, 1024, true),
                                umma_desc(sk + (i >> 2) * KCHUNK + (i & 3) * 32, 16, 1024, true),
                                ID_S, i > 0);
                    umma_commit(s_full + 8 * s);
                }
                if (j >= 1) {  // O += P(j - 1) V(j - 1), once the softmax published P
                    const int jp = j - 1, s = jp & 1;
                    mbar_wait_uniform(p_full, jp & 1);
                    tc_fence_after();
                    const u32 sv = skv + s * STAGE_BYTES + 4 * half * KCHUNK;
#pragma unroll
                    for (int kk = 0; kk < BN / 16; ++kk)
                        umma_ss(tmem, umma_desc(sp + kk * 256, 128, 512, false),
                                umma_desc(sv + kk * 16 * 128, KCHUNK, 1024, true), ID_O,
                                jp > 0 || kk > 0);
                    umma_commit(empty + 8 * s);
                    umma_commit(o_done);
                }
            }
        }
        __syncwarp();
#ifdef FP8KV
    } else if (warp >= 6) {  // ---- e4m3 -> f16 converters ----
        const int t = tid - 192;
        for (int j = 0; j < n; ++j) {
            const int s = j & 1, rows = min(BN, L - (t0 + j) * BN);
            const u32 stage = skv + s * STAGE_BYTES, src = stage + FP8_OFFSET;
            mbar_wait_uniform(conv + 8 * s, (j >> 1) & 1);
            uint4 v[3];
            load_box(v, src, t, rows);
            store_box(v, stage, t, 0);
            load_box(v, src + BOX8, t, rows);
            named_sync(2, 128);  // box 0 read by every converter
            store_box(v, stage, t, 1);
            load_box(v, src + 2 * BOX8, t, rows);
            named_sync(2, 128);  // box 2 read by every converter
            store_box(v, stage, t, 2);
            fence_async_shared();
            mbar_arrive(full + 8 * s);
        }
#endif
    } else {  // ---- softmax / correction / epilogue: warps 2..5 ----
        const int t = tid - 64, row = 32 * (warp & 3) + lane;  // this thread's head (local)
        const u32 lane_addr = (u32)(32 * (warp & 3)) << 16;
#ifdef FP8KV
        c *= *kv_scale;  // logits of the dequantised rows
#endif
        {   // the Q block [128 heads x 576] into 9 swizzled chunks; rows past H are zeros
            const u16* qb = q + (long)b * q_st + (long)h0 * q_sh;
            for (int i = t; i < HM * DW / 8; i += 128) {
                const int r = i / (DW / 8), ch = i % (DW / 8);
                const bool ok = r < hrows;
#if defined(FP8KV) && !defined(QF16)
                uint4 x = make_uint4(0u, 0u, 0u, 0u);  // bf16 q rounded to f16, the MMAs' type
                if (ok) x = *(const uint4*)(qb + (long)r * q_sh + ch * 8);
                const u32 w[4] = {x.x, x.y, x.z, x.w};
                u32 f[4];
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    f[k] = pack2(__uint_as_float(w[k] << 16),
                                 __uint_as_float(w[k] & 0xffff0000u));
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                             :: "r"(swz(sq + (ch >> 3) * QCHUNK, r, ch & 7)), "r"(f[0]),
                                "r"(f[1]), "r"(f[2]), "r"(f[3]) : "memory");
#else
                cp_async16(swz(sq + (ch >> 3) * QCHUNK, r, ch & 7),
                           qb + (long)(ok ? r : 0) * q_sh + ch * 8, ok ? 16 : 0);
#endif
            }
            asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
            fence_async_shared();
            mbar_arrive(q_full);
        }
        float m = NEG_INF, l = 0.f;  // running max (base 2, possibly stale by < 2^8) and sum
        float s[BN];
        for (int j = 0; j < n; ++j) {
            const int sb = j & 1;
            mbar_wait_uniform(s_full + 8 * sb, (j >> 1) & 1);
            tc_fence_after();
            tmem_ld32(tmem + lane_addr + S_COL + BN * sb, s);
            tmem_wait_ld();
            tc_fence_before();
            mbar_arrive(s_free + 8 * sb);
            const int k0 = (t0 + j) * BN;
            float x = NEG_INF;
#pragma unroll
            for (int i = 0; i < BN; ++i) {
                s[i] = k0 + i < L ? s[i] * c : NEG_INF;
                x = fmaxf(x, s[i]);
            }
            // (every tile has a key, so x is finite: the first tile always sets m)
            const bool grow = x > m + LAZY;
            const float mn = grow ? x : m, alpha = ex2(m - mn);  // (0 on the first tile)
            if (j >= 1) mbar_wait_uniform(o_done, (j - 1) & 1);  // O += P V(j - 1) done
            tc_fence_after();
            if (j >= 1 && __any_sync(0xffffffffu, grow)) {  // rescale this warp's rows of O
                float v[32];
#pragma unroll 1
                for (int cc = 0; cc < DV / 32; ++cc) {
                    tmem_ld32(tmem + lane_addr + 32 * cc, v);
                    tmem_wait_ld();
#pragma unroll
                    for (int i = 0; i < 32; ++i) v[i] *= alpha;
                    tmem_st32(tmem + lane_addr + 32 * cc, v);
                }
                tmem_wait_st();
            }
            m = mn;
            float sum = 0.f;
            u32 p[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const float e0 = ex2(s[2 * i] - m), e1 = ex2(s[2 * i + 1] - m);
                sum += e0 + e1;
                p[i] = pack2(e0, e1);
            }
            l = fmaf(l, alpha, sum);
            // P [128 x 32] K-major in 8 x 16-byte core matrices: (row, k) at (row / 8) 512 +
            // (k / 8) 128 + (row % 8) 16 + (k % 8) 2 (LBO 128 along K, SBO 512 along rows)
#pragma unroll
            for (int g = 0; g < BN / 8; ++g)
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                             :: "r"(sp + (row >> 3) * 512 + g * 128 + (row & 7) * 16),
                                "r"(p[4 * g]), "r"(p[4 * g + 1]), "r"(p[4 * g + 2]),
                                "r"(p[4 * g + 3]) : "memory");
            fence_async_shared();
            tc_fence_before();
            mbar_arrive(p_full);
        }
        // ---- epilogue: O / l, this CTA's 256 columns ----
        mbar_wait_uniform(o_done, (n - 1) & 1);
        tc_fence_after();
#ifdef FP8KV
        const float ks = *kv_scale;  // o = kv_scale * softmax(...) @ rows
#else
        const float ks = 1.f;
#endif
        const float inv = ks / l;
        const bool keep = row < hrows;
        float v[32];
#pragma unroll 1
        for (int cc = 0; cc < DV / 32; ++cc) {
            tmem_ld32(tmem + lane_addr + 32 * cc, v);  // (warp-collective: every row loads)
            tmem_wait_ld();
            if (!keep) continue;
            const int col = col0 + 32 * cc;
            if (num_splits == 1) {
                u16* dst = o + (long)b * o_st + (long)(h0 + row) * o_sh + col;
#pragma unroll
                for (int i = 0; i < 16; i += 4)
                    *(uint4*)(dst + 2 * i) = make_uint4(
                        pack_out(v[2 * i] * inv, v[2 * i + 1] * inv),
                        pack_out(v[2 * i + 2] * inv, v[2 * i + 3] * inv),
                        pack_out(v[2 * i + 4] * inv, v[2 * i + 5] * inv),
                        pack_out(v[2 * i + 6] * inv, v[2 * i + 7] * inv));
            } else {
                float* dst = po + ((long)(b * H + h0 + row) * num_splits + split) * DC + col;
#pragma unroll
                for (int i = 0; i < 32; i += 4)
                    *(float4*)(dst + i) = make_float4(v[i] * inv, v[i + 1] * inv,
                                                      v[i + 2] * inv, v[i + 3] * inv);
            }
        }
        if (num_splits > 1 && half == 0 && keep)  // natural-log LSE of the split
            plse[(long)(b * H + h0 + row) * num_splits + split] =
                (m + __log2f(l)) * 0.69314718055994531f;
    }
    tc_fence_before();
    __syncthreads();  // every TMEM read and MMA is done: give the columns back
    if (warp == 1) {
        tc_fence_after();
        tmem_dealloc<TMEM_COLS>(tmem);
    }
#else
    asm volatile("trap;\n");  // built without sm_100a features: fail loudly, never return zeros
#endif
}
