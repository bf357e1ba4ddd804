// Absorbed-MLA decode for Hopper (sm_90a): warpgroup MMAs (wgmma) on a paged latent cache fed
// by TMA. One query token per request; each cache row is [c_kv (512) | k_rope (64)], shared by
// all heads; o = softmax(c * q . row) @ rows[:, :512]. 16-bit q and cache (bf16, or fp16 with
// -DFP16), 64 heads per CTA (a last block of fewer heads runs on zero rows of Q that are never
// stored), pages of 64 / 128 / 256 rows.
//
// Why a separate kernel: with 64-128 heads the op is bound by its MMAs (2 * 64 * 1088 FLOPs per
// 1152-byte row and head block), and the Triton kernel keeps a [64 x 512] fp32 accumulator in
// one warpgroup's registers (255 registers, ~230 TFLOP/s). Here the 512 output columns are split
// between two consumer warpgroups (a [64 x 256] accumulator each, 128 registers per thread).
//
// CTA = 384 threads, one (request, 64-head block, KV split) work item:
//  * warpgroup 0 (producer) gives its registers away (setmaxnreg); its warp 0 copies 64-row
//    tiles of the request's cache rows (9 TMA boxes of [64 rows x 64 columns], 128-byte
//    swizzle) into a 2-stage ring; a last, partial tile goes as 1-row boxes (slots past the
//    request's length are never read; the ring starts zeroed, so unread rows hold finite data);
//  * the consumers take the tiles' logits in turn: consumer a computes S = Q K^T (36 x
//    m64n64k16, Q and the tile from shared memory) for tiles j = a, a + 2, ..., runs the online
//    softmax with the running row max it got from the other consumer, publishes P (bf16, into a
//    shared buffer), the rescale factor, the new max and the row sum, and signals the other
//    through a named barrier; both then add P V for their half of the columns (m64n256k16; the
//    owner's P from registers, the other's from the shared buffer). A stage is released when
//    both consumers' P V on it completed.
//  * splits: the plan may split a request's tiles over several CTAs; their partial o (fp32) and
//    log-sum-exp go to a workspace, merged by the attention family's merge kernel.

#if defined(FP16) || defined(FP8KV)  // the MMAs' operand type (fp8 latents: e4m3 -> f16 exact)
#define DT "f16"
#define CVT_PACK "cvt.rn.f16x2.f32"
#else
#define DT "bf16"
#define CVT_PACK "cvt.rn.bf16x2.f32"
#endif
#if defined(FP16) || (defined(FP8KV) && defined(QF16))  // the output's (q's) type
#define CVT_OUT "cvt.rn.f16x2.f32"
#else
#define CVT_OUT "cvt.rn.bf16x2.f32"
#endif
#define DC 512                     // latent width (the output's)
#define DW 576                     // row width: latent + rope
#define NCH 9                      // 64-column chunks per row
#define BN 64                      // rows (keys) per tile
#define CHUNK (64 * 128)           // one [64 rows x 64 columns] 16-bit chunk, 128-byte rows
#define Q_BYTES (NCH * CHUNK)      // 72 KB
#define STAGE_BYTES (NCH * CHUNK)  // 72 KB
#define P_OFFSET (Q_BYTES + 2 * STAGE_BYTES)
#define ST_OFFSET (P_OFFSET + CHUNK)          // alpha[64], m[64], rowsum[64] (floats)
#define BAR_OFFSET (ST_OFFSET + 3 * 64 * 4)   // full[2], empty[2], loaded[2]
#define SMEM_BYTES (BAR_OFFSET + 48 + 1024)   // + alignment slack
#define BOX8 (64 * 192)            // fp8 latents: one [64 rows x 192 bytes] TMA box
#define FP8_OFFSET (STAGE_BYTES / 2)  // ... 3 of them in a stage's upper half
#ifndef PRODUCER_REGS
#define PRODUCER_REGS 40
#endif
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 232
#endif
// fp8 latents: the producer converts, so it keeps more. setmaxnreg moves registers within the
// CTA's allocation (168 x 384 at launch): what the consumers gain the producer must give,
// P + 2 C <= 3 x 168 = 504, or the consumers' setmaxnreg.inc waits forever (it did, with
// 128 + 2 x 192, in this kernel's first fp8 run)
#ifndef FP8_PRODUCER_REGS
#define FP8_PRODUCER_REGS 120      // (fewer spill, ptxas -v; the consumers need 192)
#endif
#ifndef FP8_CONSUMER_REGS
#define FP8_CONSUMER_REGS 192
#endif
#if FP8_PRODUCER_REGS + 2 * FP8_CONSUMER_REGS > 504 || PRODUCER_REGS + 2 * CONSUMER_REGS > 504
#error "setmaxnreg: the consumers would take more registers than the producer gives back"
#endif

#include "hopper_common.cuh"

__device__ __forceinline__ u32 pack_out(float lo, float hi) {
    u32 d;
    asm(CVT_OUT " %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}


// S = Q K^T over the 9 column chunks of the Q block and of a stage's tile
__device__ __forceinline__ void issue_s(float* s, u32 sq, u32 sk) {
#pragma unroll
    for (int i = 0; i < 4 * NCH; ++i)
        wgmma_ss_m64n64_k(s, desc(sq + (i >> 2) * CHUNK + (i & 3) * 32, 16, 1024),
                desc(sk + (i >> 2) * CHUNK + (i & 3) * 32, 16, 1024), i > 0);
}
__device__ __forceinline__ void fence_acc(float* acc) {
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
}

#ifdef FP8KV
// fp8 latents: the staged tile is 3 boxes of [64 rows x 192 bytes] (columns 0..191, 192..383,
// 384..575), each 768 16-byte units, unit u = row u / 12, columns 16 (u % 12) ... Producer
// thread t takes units t, t + 128, ... of a box: a warp reads 512 consecutive bytes (no bank
// conflicts; reading a row's columns per thread put 16 threads on one bank group). Rows past
// the request (r >= rows) read as zeros: the stage holds stale bytes there, possibly NaN as e4m3.
__device__ __forceinline__ void load_box(uint4* v, u32 box, int t, int rows) {
#pragma unroll
    for (int m = 0; m < 6; ++m) {
        const int u = t + 128 * m;
        if (u / 12 < rows)
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[m].x), "=r"(v[m].y), "=r"(v[m].z), "=r"(v[m].w)
                         : "r"(box + 16 * u) : "memory");
        else
            v[m] = make_uint4(0u, 0u, 0u, 0u);
    }
}
// ... those units as f16 into the swizzled [64 x 64] chunks of the stage (e4m3 -> f16 is exact)
__device__ __forceinline__ void store_box(const uint4* v, u32 stage, int t, int box) {
#pragma unroll
    for (int m = 0; m < 6; ++m) {
        const int u = t + 128 * m, r = u / 12, c = box * 192 + (u % 12) * 16;
        const u32 w[4] = {v[m].x, v[m].y, v[m].z, v[m].w};
        u32 f[8];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\n"
                "cvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
                : "=r"(f[2 * k]), "=r"(f[2 * k + 1]) : "r"(w[k]));
        const u32 chunk = stage + (c >> 6) * CHUNK;
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                     :: "r"(swz(chunk, r, (c & 63) >> 3)), "r"(f[0]), "r"(f[1]), "r"(f[2]),
                        "r"(f[3]) : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                     :: "r"(swz(chunk, r, ((c & 63) >> 3) + 1)), "r"(f[4]), "r"(f[5]), "r"(f[6]),
                        "r"(f[7]) : "memory");
    }
}
#endif

// kvmap / kvmap1: a layer's latent cache seen as a 2-D [pages * page_size, 576] tensor, boxes of
// 64 columns x 64 rows / x 1 row. q [B, H, 576] (strides q_st, q_sh), o [B, H, 512] (o_st, o_sh);
// num_splits > 1: po [B * H * num_splits, 512] fp32 and plse [B * H * num_splits] instead.
extern "C" __global__ void __launch_bounds__(384, 1)
mla_decode_wgmma_kernel(const __grid_constant__ TensorMap kvmap,
                        const __grid_constant__ TensorMap kvmap1,
                        const u16* __restrict__ q, u16* __restrict__ o,
                        float* __restrict__ po, float* __restrict__ plse,
                        const int* __restrict__ seq_lens, const int* __restrict__ page_table,
#ifdef FP8KV
                        const float* __restrict__ kv_scale, float c, int H, int num_splits,
                        int page_shift, long q_st, long q_sh, long o_st, long o_sh, long pt_st,
                        const unsigned char* __restrict__ kv8) {
#else
                        float c, int H, int num_splits, int page_shift, long q_st, long q_sh,
                        long o_st, long o_sh, long pt_st) {
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 sq = base, skv = base + Q_BYTES, sp = base + P_OFFSET, sst = base + ST_OFFSET;
    const u32 bars = base + BAR_OFFSET;  // full[s] at bars + 8 s, empty[s] at bars + 16 + 8 s
    float* st_alpha = (float*)(smem_raw + (sst - smem_addr(smem_raw)));
    float* st_m = st_alpha + 64;
    float* st_sum = st_alpha + 128;

    const int hb_count = (H + 63) >> 6;
    const int pid = blockIdx.x;
    const int hb = pid % hb_count, split = (pid / hb_count) % num_splits;
    const int b = pid / (hb_count * num_splits);
    const int h0 = hb * 64, hrows = min(64, H - h0);  // a last block may be partial
    const int L = seq_lens[b];
    const int tiles = (L + BN - 1) / BN, per = (tiles + num_splits - 1) / num_splits;
    const int t0 = split * per, n = min(tiles, t0 + per) - t0;  // this CTA's tiles
    const int tid = threadIdx.x, wg = tid >> 7;

    if (n <= 0) {  // nothing to attend (empty request or split): o = 0, lse = -inf
        for (int i = tid; i < hrows * DC / 2; i += 384) {
            const int r = i / (DC / 2), col = 2 * (i % (DC / 2));
            if (num_splits == 1)
                *(u32*)(o + (long)b * o_st + (long)(h0 + r) * o_sh + col) = 0u;
            else
                *(float2*)(po + ((long)(b * H + h0 + r) * num_splits + split) * DC + col) =
                    make_float2(0.f, 0.f);
        }
        if (num_splits > 1 && tid < hrows)
            plse[(long)(b * H + h0 + tid) * num_splits + split] = NEG_INF;
        return;
    }

    if (tid == 0) {
        for (int s = 0; s < 2; ++s) {
#ifdef FP8KV
            mbar_init(bars + 8 * s, 128);        // the producer warpgroup (converted)
            mbar_init(bars + 32 + 8 * s, 1);     // the TMA lane (+ bytes)
#else
            mbar_init(bars + 8 * s, 1);          // the TMA lane (+ bytes)
#endif
            mbar_init(bars + 16 + 8 * s, 256);   // consumer threads
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // the ring (and the P buffer after it) starts zeroed: rows a partial tile does not load
    // stay finite (P = 0 there, and 0 * NaN would be NaN)
    for (int i = tid; i < (2 * STAGE_BYTES + CHUNK) / 16; i += 384)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n"
                     :: "r"(skv + 16 * i), "r"(0) : "memory");
    fence_async_shared();
    __syncthreads();

#ifdef FP8KV
    // fp8 latents: the tile arrives as e4m3 in the stage's upper half (3 boxes of [64 rows x
    // 192 bytes]); the producer warpgroup converts it to f16 into the swizzled chunks the MMAs
    // read, over the same bytes (no f16 is written over e4m3 bytes not yet read by every
    // producer thread); the converting producer keeps FP8_PRODUCER_REGS
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(FP8_PRODUCER_REGS));
        const int* pt = page_table + (long)b * pt_st;
        const int pmask = (1 << page_shift) - 1;
        auto issue = [&](int j) {  // warp 0: tile j's TMA copies
            const int s = j & 1, k0 = (t0 + j) * BN, rows = min(BN, L - k0);
            const u32 dst = skv + s * STAGE_BYTES + FP8_OFFSET, bar = bars + 32 + 8 * s;
            const int row0 = (pt[k0 >> page_shift] << page_shift) + (k0 & pmask);
            if (tid == 0) mbar_expect_tx(bar, rows * DW);
            __syncwarp();
            if (rows == BN) {
                if (tid < 3) tma_load(dst + tid * BOX8, &kvmap, tid * 192, row0, bar);
            } else {  // a partial tile: each row as 3 bulk copies of 192 bytes (a 1-row TMA box
                      // would land 64-byte aligned; bulk copies need 16)
                for (int r = tid; r < rows; r += 32)
                    for (int x = 0; x < 3; ++x)
                        asm volatile("cp.async.bulk.shared::cluster.global"
                                     ".mbarrier::complete_tx::bytes [%0], [%1], 192, [%2];\n"
                                     :: "r"(dst + x * BOX8 + r * 192),
                                        "l"(kv8 + (long)(row0 + r) * DW + x * 192), "r"(bar)
                                     : "memory");
            }
        };
        if (tid < 32) issue(0);
        for (int j = 0; j < n; ++j) {
            const int s = j & 1, rows = min(BN, L - (t0 + j) * BN);
            const u32 stage = skv + s * STAGE_BYTES, src = stage + FP8_OFFSET;
            mbar_wait_uniform(bars + 32 + 8 * s, (j >> 1) & 1);
            // f16 chunk k takes bytes [8k, 8k + 8) KB of the stage, the e4m3 boxes [36, 48),
            // [48, 60), [60, 72) KB: box 0 (columns 0..191) goes to chunks 0..2, below every
            // box; box 1 (192..383) to chunks 3..5, over box 0 once everyone has read it; box 2
            // (384..575) to chunks 6..8, over boxes 1 and 2 once everyone has read box 2
            uint4 v[6];
            load_box(v, src, tid, rows);
            store_box(v, stage, tid, 0);
            load_box(v, src + BOX8, tid, rows);
            named_sync(4, 128);  // box 0 read by everyone
            store_box(v, stage, tid, 1);
            load_box(v, src + 2 * BOX8, tid, rows);
            named_sync(4, 128);  // box 2 read by everyone
            store_box(v, stage, tid, 2);
            fence_async_shared();
            mbar_arrive(bars + 8 * s);
            if (tid < 32 && j + 1 < n) {  // the next tile, once its stage is released
                if (j + 1 >= 2)
                    mbar_wait_uniform(bars + 16 + 8 * ((j + 1) & 1), (((j + 1) >> 1) - 1) & 1);
                issue(j + 1);
            }
        }
        // the empty "tile n", as below
        if (n >= 2) mbar_wait_uniform(bars + 16 + 8 * (n & 1), ((n >> 1) - 1) & 1);
        mbar_arrive(bars + 8 * (n & 1));
        return;
    }
#else
    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(PRODUCER_REGS));
        if (tid < 32) {
            const int* pt = page_table + (long)b * pt_st;
            const int pmask = (1 << page_shift) - 1;
            // tiles 0 .. n - 1, then an empty "tile n" (an arrival without bytes): the consumer
            // whose last iteration has no tile of its own waits on it like on any other
            for (int j = 0; j <= n; ++j) {
                const int s = j & 1;
                if (j >= 2) mbar_wait_uniform(bars + 16 + 8 * s, ((j >> 1) - 1) & 1);
                const u32 dst = skv + s * STAGE_BYTES, full = bars + 8 * s;
                if (j == n) {
                    if (tid == 0) mbar_arrive(full);
                    break;
                }
                const int k0 = (t0 + j) * BN, rows = min(BN, L - k0);
                const int row0 = (pt[k0 >> page_shift] << page_shift) + (k0 & pmask);
                if (tid == 0) mbar_expect_tx(full, rows * DW * 2);
                __syncwarp();
                if (rows == BN) {
                    if (tid < NCH) tma_load(dst + tid * CHUNK, &kvmap, tid * 64, row0, full);
                } else {  // a tile inside one page: its rows are consecutive cache rows
                    for (int r = tid; r < rows; r += 32)
#pragma unroll
                        for (int ch = 0; ch < NCH; ++ch)
                            tma_load(dst + ch * CHUNK + r * 128, &kvmap1, ch * 64, row0 + r, full);
                }
            }
        }
        return;
    }
#endif

    // consumers
#ifndef FP8KV
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(CONSUMER_REGS));
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(FP8_CONSUMER_REGS));
    c *= *kv_scale;  // logits of the dequantised rows
#endif
    const int a = wg - 1, tw = tid - 128 * wg;
    const int warp = tw >> 5, lane = tw & 31, qr = lane >> 2, qc = lane & 3;
    const int rowA = 16 * warp + qr, rowB = rowA + 8;  // head rows of this thread (block-local)
    {   // the Q block [64 heads x 576] into 9 swizzled chunks, by both consumers
        const u16* qb = q + (long)b * q_st + (long)h0 * q_sh;
        const int t2 = tid - 128;
        for (int i = t2; i < 64 * DW / 8; i += 256) {
            const int r = i / (DW / 8), ch = i % (DW / 8);
            const bool ok = r < hrows;  // rows past the heads: zeros (finite logits, unused)
#if defined(FP8KV) && !defined(QF16)
            // bf16 q rounded to f16, the MMAs' type (|q| < 65504 assumed)
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (ok) x = *(const uint4*)(qb + (long)r * q_sh + ch * 8);
            const u32 w[4] = {x.x, x.y, x.z, x.w};
            u32 f[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
                f[k] = pack2(__uint_as_float(w[k] << 16), __uint_as_float(w[k] & 0xffff0000u));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                         :: "r"(swz(sq + (ch >> 3) * CHUNK, r, ch & 7)), "r"(f[0]), "r"(f[1]),
                            "r"(f[2]), "r"(f[3]) : "memory");
#else
            cp_async16(swz(sq + (ch >> 3) * CHUNK, r, ch & 7),
                       qb + (long)(ok ? r : 0) * q_sh + ch * 8, ok ? 16 : 0);
#endif
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        fence_async_shared();
        named_sync(3, 256);
    }

    float acc[128], s[32];
    u32 p[16];
    float mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;  // running row max (base 2) / sum
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) p[i] = 0u;
    const int SIG_MINE = 1 + a, SIG_OTHER = 2 - a;  // named barriers: "tile ready" per owner

    // Iteration k: the other consumer's tile jb = 2k - 1 + a (none for jb = -1), then my tile
    // ja = jb + 1 (none past the last). Every wgmma sits in straight-line code (ptxas
    // serialises all of them when one is in a divergent path): a missing tile's MMAs run on
    // zeros (the zeroed P buffer, p = 0) against a finite stage and add nothing.
    const int iters = (n - a) / 2 + 1;
    for (int k = 0; k < iters; ++k) {
        const int jb = 2 * k - 1 + a, ja = jb + 1;
        // ---- the other consumer's tile jb: O += P_jb V_jb for my columns ----
#pragma unroll
        for (int i = 0; i < 32; ++i) reg_fence(s[i]);
        if (jb >= 1) mbar_arrive(bars + 16 + 8 * ((jb - 1) & 1));
        {
            float aA = 1.f, aB = 1.f;
            if (jb >= 0) {
                named_sync(SIG_OTHER, 256);
                aA = st_alpha[rowA];
                aB = st_alpha[rowB];
                lA = fmaf(lA, aA, st_sum[rowA]);
                lB = fmaf(lB, aB, st_sum[rowB]);
                mA = st_m[rowA];
                mB = st_m[rowB];
            }
            rescale_rows<32>(acc, aA, aB);
            fence_acc(acc);
        }
        const u32 svb = skv + ((jb + 2) & 1) * STAGE_BYTES + 4 * a * CHUNK;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_ss_m64n256_t(acc, desc(sp + kk * 32, 16, 1024),
                               desc(svb + kk * 16 * 128, CHUNK, 1024), 1);
        wgmma_commit();
        // ---- my tile ja: S = Q K^T, softmax, publish P, O += P V ----
        const u32 sta = skv + (ja & 1) * STAGE_BYTES;
        mbar_wait_uniform(bars + 8 * (ja & 1), (ja >> 1) & 1);  // (tile n: an empty one)
        wgmma_fence();
        issue_s(s, sq, sta);
        wgmma_commit();
        wgmma_wait<1>();  // P V of tile jb is done: release its stage
        if (jb >= 0) mbar_arrive(bars + 16 + 8 * (jb & 1));
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) reg_fence(s[i]);
        {   // a missing tile (ja >= n) has every key masked: p = 0, alpha = 1
            const int k0 = (t0 + ja) * BN, lim = ja < n ? L : 0;
            if (k0 + BN > lim) {
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (k0 + 8 * i + 2 * qc + e >= lim) {
                            s[4 * i + e] = NEG_INF;
                            s[4 * i + 2 + e] = NEG_INF;
                        }
            }
            float xA, xB;
            row_max2<8>(s, xA, xB);
            const float nA = fmaxf(mA, quad_max(xA) * c);
            const float nB = fmaxf(mB, quad_max(xB) * c);
            // (nA = -inf only before any key, where acc is still 0 either way)
            const float zA = nA == NEG_INF ? 0.f : nA, zB = nB == NEG_INF ? 0.f : nB;
            const float aA = ex2(mA - zA), aB = ex2(mB - zB);
            float sumA = 0.f, sumB = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                s[4 * i] = ex2(fmaf(s[4 * i], c, -zA));
                s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], c, -zA));
                s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], c, -zB));
                s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], c, -zB));
                sumA += s[4 * i] + s[4 * i + 1];
                sumB += s[4 * i + 2] + s[4 * i + 3];
                p[2 * i] = pack2(s[4 * i], s[4 * i + 1]);
                p[2 * i + 1] = pack2(s[4 * i + 2], s[4 * i + 3]);
            }
            sumA = quad_sum(sumA);
            sumB = quad_sum(sumB);
            lA = fmaf(lA, aA, sumA);
            lB = fmaf(lB, aB, sumB);
            mA = nA;
            mB = nB;
            if (ja < n) {
                // publish P, the rescale factor, the new max and the row sum (the other
                // consumer read the previous ones before its P V of that tile, which my wait
                // above ordered before this)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    asm volatile("st.shared.u32 [%0], %1;\n"
                                 :: "r"(swz(sp, rowA, i) + 4 * qc), "r"(p[2 * i]) : "memory");
                    asm volatile("st.shared.u32 [%0], %1;\n"
                                 :: "r"(swz(sp, rowB, i) + 4 * qc), "r"(p[2 * i + 1]) : "memory");
                }
                if (qc == 0) {
                    st_alpha[rowA] = aA;
                    st_alpha[rowB] = aB;
                    st_m[rowA] = nA;
                    st_m[rowB] = nB;
                    st_sum[rowA] = sumA;
                    st_sum[rowB] = sumB;
                }
                fence_async_shared();
                named_arrive(SIG_MINE, 256);
            }
            rescale_rows<32>(acc, aA, aB);
        }
        fence_acc(acc);
#pragma unroll
        for (int i = 0; i < 16; ++i) reg_fence(p[i]);
        const u32 sva = sta + 4 * a * CHUNK;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_rs_m64n256_t(acc, p + 4 * kk, desc(sva + kk * 16 * 128, CHUNK, 1024));
        wgmma_commit();
        // (waiting here rather than at the next iteration's top: the same schedule, since that
        // starts by needing this P V's stage released; a wait across the loop's exit makes
        // ptxas serialise the MMAs)
        wgmma_wait<0>();  // my P V of tile ja is done: its stage is released next iteration
        fence_acc(acc);
    }

#ifdef FP8KV
    const float ks = *kv_scale;  // o = kv_scale * softmax(...) @ rows
#else
    const float ks = 1.f;
#endif
    const int col0 = 256 * a + 2 * qc;
    // this thread's two rows: A (accumulator slots 4i, 4i + 1) and B (4i + 2, 4i + 3)
    const int rows[2] = {rowA, rowB};
    const float ms[2] = {mA, mB}, ls[2] = {lA, lB};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (rows[r] >= hrows) continue;
        const float inv = ks / ls[r];
        if (num_splits == 1) {
            u16* dst = o + (long)b * o_st + (long)(h0 + rows[r]) * o_sh + col0;
#pragma unroll
            for (int i = 0; i < 32; ++i)
                *(u32*)(dst + 8 * i) = pack_out(acc[4 * i + 2 * r] * inv,
                                                acc[4 * i + 2 * r + 1] * inv);
        } else {
            const long row = (long)(b * H + h0 + rows[r]) * num_splits + split;
            float* dst = po + row * DC + col0;
#pragma unroll
            for (int i = 0; i < 32; ++i)
                *(float2*)(dst + 8 * i) = make_float2(acc[4 * i + 2 * r] * inv,
                                                      acc[4 * i + 2 * r + 1] * inv);
            if (a == 0 && qc == 0)  // natural-log LSE of the split (m in base-2 units)
                plse[row] = (ms[r] + __log2f(ls[r])) * 0.69314718055994531f;
        }
    }
#else
    asm volatile("trap;\n");  // built without sm_90a features: fail loudly, never return zeros
#endif
}
