// Causal prefill attention for Hopper (sm_90a): warpgroup MMAs (wgmma) from shared memory fed
// by TMA, one producer warpgroup and two consumer warpgroups taking turns on the tensor cores
// (one runs its MMAs while the other runs its softmax). Head dim 128, 16-bit q / K / V (bf16,
// or fp16 with -DFP16), GQA by head index, a ragged batch of requests with no cached prefix:
// request b's n_b tokens attend to themselves causally, K / V read from the new tokens' own
// [T, Hkv, 128] tensors (packed heads, any 16-byte-aligned row stride) through two 2-D TMA
// descriptors ([T, Hkv * 128], boxes of 64 columns x BN rows, 128-byte swizzle).
//
// CTA = 384 threads, one (128-query block, query head) work item:
//  * warpgroup 0 (producer) gives most of its registers away (setmaxnreg); one thread copies
//    BN-key K and V tiles into a STAGES-deep ring (4 TMA boxes per stage, completion counted in
//    bytes on the stage's "full" mbarrier; the consumers' 256 arrivals on "empty" free it);
//  * warpgroups 1 and 2 (consumers) own query rows 0..63 and 64..127 of the block. Per key tile:
//    S = Q K^T (8 x m64nBNk16, both operands from shared memory, K-major) is issued with the
//    previous tile's O += P V (BN / 16 x m64n128k16, P from registers, V read N-major) as two
//    commit groups; the softmax of S runs once S is in, while that P V still runs, then O is
//    rescaled and P packed. Named barriers hand the MMA issue slot back and forth between the
//    two consumers, so one consumer's MMAs overlap the other's softmax.
//  * O leaves through the consumer's (by then unused) rows of the Q tile as 16-byte chunks.
// Masking: only the tiles at or past a consumer's first row are masked; with BN = 64 the
// consumer owning rows 0..63 skips the block's last tile (above its diagonal) but keeps the
// barrier protocol. Options (-D): STAGES, BN (64 / 128), FP16; NOPINGPONG and DIRECT_STORE
// turn the turn-taking and the shared-memory epilogue off (measured alternatives, see
// benchmarks/RESULTS.md, "attention.extend"). PAGED reads every key from the paged cache
// instead (any cached prefix; the producer's warp 0 looks up the page ids and copies page by
// page; run-verified on the H200). PAGED + SPLIT splits the keys: a work item is (request,
// query block, key tiles t0 .. t1 - 1, split index) and writes its rows' normalised fp32 O and
// natural-log LSE into a split-KV workspace instead of o (rows [(token * hq + h) * splits + sp,
// 128], the layout ops/shared/split_kv.py merges); the host keeps every tile that needs the
// causal mask in a request's last split and starts each split at or below the block's first
// query position, so every row of every split sees at least one key (compile-verified until
// its GPU run). PAGED + PACK (with or without SPLIT) packs GQA: a block's 128 rows are
// (token, head-in-group) pairs of one KV head (row r = token * group + g: 128 / group tokens),
// one work item per (block, KV head), so a short extend fills the tile and each K/V tile is
// read once per group; positions (masking) are pre + row / group (compile-verified until its
// GPU run). Shared helpers and the wgmma wrappers: hopper_common.cuh.

#ifndef STAGES
#define STAGES 3                   // 226 KB with BN = 128
#endif
#ifdef FP16
#define DT "f16"
#define CVT_PACK "cvt.rn.f16x2.f32"
#else
#define DT "bf16"
#define CVT_PACK "cvt.rn.bf16x2.f32"
#endif
#define HD 128
#define BM 128                     // query rows per CTA (two consumer warpgroups x 64)
#ifndef BN
#define BN 128                     // keys per tile (64 or 128)
#endif
#define Q_BYTES (BM * HD * 2)      // 32 KB: two 64-column halves of [128 rows x 128 B]
#define Q_HALF (BM * 128)
#define KV_HALF (BN * 128)         // one 64-column half of a [BN keys x 128 d] tile
#define TILE_BYTES (BN * HD * 2)
#define STAGE_BYTES (2 * TILE_BYTES)
#define BAR_OFFSET (Q_BYTES + STAGES * STAGE_BYTES)
#define SMEM_BYTES (BAR_OFFSET + 16 * STAGES + 1024)  // + alignment slack
#ifndef PRODUCER_REGS              // registers per thread after setmaxnreg (warpgroup 0 gives
#define PRODUCER_REGS 40           // its share to the consumers: 40 + 2 x 232 <= 512)
#endif
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 232
#endif

#include "hopper_common.cuh"

#if defined(SPLIT) && !defined(PAGED)
#error "SPLIT needs PAGED (the split work items and workspace are the paged kernel's)"
#endif
#ifdef PACK
#if !defined(PAGED) || defined(DIRECT_STORE)
#error "PACK needs PAGED and the shared-memory epilogue"
#endif
#define GRP group                  // query rows per token in a block (GQA packing)
#else
#define GRP 1
#endif

// the key tile's logits and the P V product (hopper_common.cuh)
#if BN == 64
#define wgmma_qk wgmma_ss_m64n64_k
#else
#define wgmma_qk wgmma_ss_m64n128_k
#endif
#define wgmma_pv wgmma_rs_m64n128_t


// K and V rows (the maps' box) at `row`, both 64-column halves, into a stage's K and V tiles
// at byte offset d (4 boxes)
__device__ __forceinline__ void copy_kv(u32 d, const TensorMap* km, const TensorMap* vm,
                                        int col, int row, u32 bar) {
    tma_load(d, km, col, row, bar);
    tma_load(d + KV_HALF, km, col + 64, row, bar);
    tma_load(d + TILE_BYTES, vm, col, row, bar);
    tma_load(d + TILE_BYTES + KV_HALF, vm, col + 64, row, bar);
}

// before a batch of MMAs: the accumulator and P registers were last written by ordinary
// instructions (rescale, packing); fence them, then wgmma.fence
__device__ __forceinline__ void operands_ready(float* acc, u32* p) {
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) reg_fence(p[i]);
    wgmma_fence();
}

// O += P V over one BN-key V tile at shared address sv (N-major, two 64-column halves)
__device__ __forceinline__ void issue_pv(float* acc, const u32* p, u32 sv) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_pv(acc, p + 4 * kk, desc(sv + kk * 16 * 128, KV_HALF, 1024));
}

#ifdef PAGED
// K / V from the paged cache (any cached prefix): kmap / vmap see a layer's cache as a 2-D
// [pages * page_size, Hkv * 128] tensor with boxes of min(page_size, BN) rows (one page, or a
// tile's part of one), kmap1 / vmap1 the same tensor with 1-row boxes (a last, partial page:
// slots past a request's length are never read, whatever they hold). page_size = 1 << page_shift,
// 8 .. 256.
extern "C" __global__ void __launch_bounds__(384, 1)
prefill_wgmma_kernel(const __grid_constant__ TensorMap kmap,
                     const __grid_constant__ TensorMap vmap,
                     const __grid_constant__ TensorMap kmap1,
                     const __grid_constant__ TensorMap vmap1,
                     const u16* __restrict__ q, u16* __restrict__ o,
                     const int* __restrict__ qo_indptr, const int* __restrict__ work,
                     const int* __restrict__ seq_lens, const int* __restrict__ page_table,
                     float c, int hq, int group, int page_shift, long q_st, long q_sh,
                     long o_st, long o_sh, long pt_st
#ifdef SPLIT
                     , float* __restrict__ part_o, float* __restrict__ part_lse, int splits
#endif
                     ) {
#else
// kn / vn / k_st / v_st: the tensors the maps describe (unused by the TMA path; kept so that the
// launch ABI matches the measured build)
extern "C" __global__ void __launch_bounds__(384, 1)
prefill_wgmma_kernel(const __grid_constant__ TensorMap kmap,
                     const __grid_constant__ TensorMap vmap,
                     const u16* __restrict__ q, const u16* __restrict__ kn,
                     const u16* __restrict__ vn, u16* __restrict__ o,
                     const int* __restrict__ qo_indptr, const int* __restrict__ work,
                     float c, int num_rows, int hq, int group, long q_st, long q_sh, long k_st,
                     long v_st, long o_st, long o_sh) {
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 sq = base, skv = base + Q_BYTES, bars = base + BAR_OFFSET;
    // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)

    const int pid = blockIdx.x;
#ifdef PACK
    const int hkv = hq / group, kvh = pid % hkv, wi = pid / hkv, h = kvh * group;  // h: row 0's
#else
    const int h = pid % hq, wi = pid / hq, kvh = h / group;
#endif
#ifdef SPLIT
    // (request, query block, first tile, end tile, split index)
    const int b = work[5 * wi], m0 = work[5 * wi + 1] * BM, t0 = work[5 * wi + 2];
#else
    const int b = work[2 * wi], m0 = work[2 * wi + 1] * BM, t0 = 0;
#endif
    const int q_start = qo_indptr[b], n_tok = qo_indptr[b + 1] - q_start;
    const int n = n_tok * GRP;                    // the request's query rows
#ifdef PAGED
    const int pre = seq_lens[b] - n_tok;          // cached prefix: query i sits at pre + i
#else
    const int pre = 0;
#endif
    const int last = min(m0 + BM, n) - 1;         // last query row of the block (local)
#ifdef SPLIT
    const int n_tiles = min(work[5 * wi + 3], (pre + last / GRP) / BN + 1);  // split's end
#else
    const int n_tiles = (pre + last / GRP) / BN + 1;  // keys 0 .. pre + last / GRP
#endif

    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);                    // the TMA thread (+ bytes)
            mbar_init(bars + 8 * (STAGES + s), 256);       // consumer threads
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#ifdef PAGED
    // rows a tile does not load (past the request's last key) keep what the stage held before:
    // zeros at first, so that P = 0 never meets a non-finite V (0 * NaN = NaN)
    for (int i = tid; i < STAGES * STAGE_BYTES / 16; i += 384)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n"
                     :: "r"(skv + 16 * i), "r"(0) : "memory");
    fence_async_shared();  // before the TMA (async proxy) writes the same bytes
#endif
    __syncthreads();

    if (wg == 0) {  // producer
#ifndef NO_SETMAXNREG
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(PRODUCER_REGS));
#endif
#ifdef PAGED
        // warp 0 issues the tile copies (TMA): its lanes read the tile's page ids in parallel
        // and each copies its own page parts (4 boxes each: K, V x two column halves); rows of
        // a last partial page go as 1-row boxes, one per lane
        if (tid < 32) {
            const int L = pre + n_tok, box = min(1 << page_shift, BN);
            const int pmask = (1 << page_shift) - 1;
            const int* pt = page_table + (long)b * pt_st;
            for (int jt = t0; jt < n_tiles; ++jt) {
                const int lt = jt - t0, s = lt % STAGES;  // ring slots count from the split's start
                if (lt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((lt / STAGES) - 1) & 1);
                const u32 dst = skv + s * STAGE_BYTES, full = bars + 8 * s;
                const int j0 = jt * BN, rows = min(BN, L - j0), col = kvh * HD;
                const int whole = rows / box;  // full boxes (each inside one page)
                if (tid == 0) mbar_expect_tx(full, rows * 2 * HD * 2);
                __syncwarp();
                for (int i = tid; i < whole; i += 32) {
                    const int j = j0 + i * box;
                    const int row = (pt[j >> page_shift] << page_shift) + (j & pmask);
                    const u32 d = dst + (j - j0) * 128;
                    copy_kv(d, &kmap, &vmap, col, row, full);
                }
                for (int j = j0 + whole * box + tid; j < j0 + rows; j += 32) {
                    const int row = (pt[j >> page_shift] << page_shift) + (j & pmask);
                    const u32 d = dst + (j - j0) * 128;
                    copy_kv(d, &kmap1, &vmap1, col, row, full);
                }
            }
        }
#else
        // one thread issues the tile copies (TMA): 4 boxes per stage (K, V x two column halves)
        if (tid == 0) {
            for (int jt = 0; jt < n_tiles; ++jt) {
                const int s = jt % STAGES;
                if (jt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((jt / STAGES) - 1) & 1);
                const u32 dst = skv + s * STAGE_BYTES, full = bars + 8 * s;
                mbar_expect_tx(full, STAGE_BYTES);
                const int row = q_start + jt * BN, col = kvh * HD;
                copy_kv(dst, &kmap, &vmap, col, row, full);
            }
        }
#endif
        return;
    }

    // consumers
#ifndef NO_SETMAXNREG
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(CONSUMER_REGS));
#endif
    const int w = wg - 1, tw = tid - 128 * wg;
    const int warp = tw >> 5, lane = tw & 31, qr = lane >> 2, qc = lane & 3;
    const int rowA = m0 + 64 * w + 16 * warp + qr;  // local query row (and rowA + 8)
    {   // this warpgroup's 64 query rows into the swizzled Q tile
        const u16* qb = q + (long)h * q_sh;
#pragma unroll
        for (int i = 0; i < 64 * 16 / 128; ++i) {
            int idx = tw + 128 * i, r = idx >> 4, ch = idx & 15;
            int row = m0 + 64 * w + r;
            bool ok = row < n;
            const int tok = ok ? row / GRP : 0, g = ok ? row % GRP : 0;  // (token, head in group)
            const u16* p = qb + (long)(q_start + tok) * q_st + (long)g * q_sh + ch * 8;
            cp_async16(swz(sq + (ch >> 3) * Q_HALF, 64 * w + r, ch & 7), p, ok ? 16 : 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_shared();
        named_sync(3 + w, 128);
    }
    const int wlast = min(m0 + 64 * w + 63, n - 1);  // this warpgroup's last valid row
#ifdef SPLIT
    const int n_vis = min((pre + wlast / GRP) / BN + 1, n_tiles);  // end of the tiles it sees
#else
    const int n_vis = (pre + wlast / GRP) / BN + 1;   // tiles it sees (n_tiles or one less)
#endif
    const int diag = (pre + (m0 + 64 * w) / GRP) / BN;  // first tile needing the causal mask
#ifdef PACK
    const int posA = pre + rowA / GRP, posB = pre + (rowA + 8) / GRP;  // the rows' positions
#else
    const int posA = pre + rowA, posB = posA + 8;     // the rows' positions (keys they see)
#endif

    float acc[64], s[BN / 2], mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;
    u32 p[BN / 4];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) p[i] = 0u;
#ifndef NOPINGPONG
    if (w == 1) named_arrive(1, 256);  // consumer 0 issues first
#endif

    // tile jt: issue S = Q K_jt^T, then O += P V of tile jt - 1 (two commit groups), hand the
    // turn over; once S is in, its softmax runs while that P V still occupies the tensor
    // cores; then O is rescaled and P taken from S. Every wgmma sits in straight-line code (a
    // branch around one makes ptxas serialise them all): tile 0 has no previous tile, its P is
    // zero and the P V MMA adds exact zeros reading stage 0's (loaded, finite) K tile as "V".
    for (int jt = t0; jt < n_vis; ++jt) {
        const int lt = jt - t0, st = lt % STAGES, prev = (lt + STAGES - 1) % STAGES;
        const u32 sk = skv + st * STAGE_BYTES;
        const u32 sv = lt > 0 ? skv + prev * STAGE_BYTES + TILE_BYTES : sk;
        mbar_wait(bars + 8 * st, (lt / STAGES) & 1);
#ifndef NOPINGPONG
        named_sync(1 + w, 256);  // my turn to issue MMAs
#endif
        operands_ready(acc, p);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
            wgmma_qk(s, desc(sq + (kk >> 2) * Q_HALF + w * 64 * 128 + (kk & 3) * 32, 16, 1024),
                     desc(sk + (kk >> 2) * KV_HALF + (kk & 3) * 32, 16, 1024), kk > 0);
        wgmma_commit();
        issue_pv(acc, p, sv);
        wgmma_commit();
#ifndef NOPINGPONG
        if (w == 0 || jt < n_tiles - 1) named_arrive(2 - w, 256);  // the other's turn
#endif
        wgmma_wait<1>();  // S is in (P V may still run)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) reg_fence(s[i]);
        // online softmax of this tile (logits in base 2 via c = scale * log2 e), in place
        if (jt >= diag) {
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = jt * BN + 8 * i + 2 * qc + e;
                    if (key > posA) s[4 * i + e] = NEG_INF;
                    if (key > posB) s[4 * i + 2 + e] = NEG_INF;
                }
            }
        }
        float xA, xB;
        row_max2<BN / 8>(s, xA, xB);
        const float nA = fmaxf(mA, quad_max(xA) * c), nB = fmaxf(mB, quad_max(xB) * c);
        const float aA = ex2(mA - nA), aB = ex2(mB - nB);
        mA = nA;
        mB = nB;
        float sumA = 0.f, sumB = 0.f;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
            s[4 * i] = ex2(fmaf(s[4 * i], c, -mA));
            s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], c, -mA));
            s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], c, -mB));
            s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], c, -mB));
            sumA += s[4 * i] + s[4 * i + 1];
            sumB += s[4 * i + 2] + s[4 * i + 3];
        }
        lA = fmaf(lA, aA, sumA);
        lB = fmaf(lB, aB, sumB);
        wgmma_wait<0>();  // P V of tile jt - 1 is in: its stage is free, O and P may change
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
#pragma unroll
        for (int i = 0; i < BN / 4; ++i) reg_fence(p[i]);
        if (lt > 0) mbar_arrive(bars + 8 * (STAGES + prev));
        rescale_rows<16>(acc, aA, aB);
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
            p[2 * i] = pack2(s[4 * i], s[4 * i + 1]);
            p[2 * i + 1] = pack2(s[4 * i + 2], s[4 * i + 3]);
        }
    }
    {   // O += P V of the last visible tile; consumer 0 may still owe the block's last tile
        // (above its diagonal) its turn in the protocol and its stage release
        const bool skip = n_vis < n_tiles;
        const int prev = (n_vis - 1 - t0) % STAGES;
        const u32 sv = skv + prev * STAGE_BYTES + TILE_BYTES;
#ifndef NOPINGPONG
        if (skip) named_sync(1 + w, 256);
#endif
        operands_ready(acc, p);
        issue_pv(acc, p, sv);
        wgmma_commit();
#ifndef NOPINGPONG
        if (skip) named_arrive(2 - w, 256);
#endif
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
        mbar_arrive(bars + 8 * (STAGES + prev));
        if (skip) mbar_arrive(bars + 8 * (STAGES + (n_tiles - 1 - t0) % STAGES));
    }
#ifdef SPLIT
    {   // this split's normalised O rows (fp32) and their natural-log LSE into the workspace
        const float LA = quad_sum(lA), LB = quad_sum(lB), iA = 1.f / LA, iB = 1.f / LB;
        const int sp = work[5 * wi + 4];
        const float ln2 = 0.6931471805599453f;
        if (rowA < n) {
            const long r = ((long)(q_start + rowA / GRP) * hq + h + rowA % GRP) * splits + sp;
            float* dst = part_o + r * HD + 2 * qc;
#pragma unroll
            for (int i = 0; i < 16; ++i)
                *(float2*)(dst + 8 * i) = make_float2(acc[4 * i] * iA, acc[4 * i + 1] * iA);
            if (qc == 0) part_lse[r] = (mA + __log2f(LA)) * ln2;
        }
        if (rowA + 8 < n) {
            const long r = ((long)(q_start + (rowA + 8) / GRP) * hq + h + (rowA + 8) % GRP) *
                           splits + sp;
            float* dst = part_o + r * HD + 2 * qc;
#pragma unroll
            for (int i = 0; i < 16; ++i)
                *(float2*)(dst + 8 * i) = make_float2(acc[4 * i + 2] * iB,
                                                      acc[4 * i + 3] * iB);
            if (qc == 0) part_lse[r] = (mB + __log2f(LB)) * ln2;
        }
    }
#else
    const float iA = 1.f / quad_sum(lA), iB = 1.f / quad_sum(lB);
#ifdef DIRECT_STORE
    u16* ob = o + (long)h * o_sh + 2 * qc;
    if (rowA < n) {
        u32* dst = (u32*)(ob + (long)(q_start + rowA) * o_st);
#pragma unroll
        for (int i = 0; i < 16; ++i) dst[4 * i] = pack2(acc[4 * i] * iA, acc[4 * i + 1] * iA);
    }
    if (rowA + 8 < n) {
        u32* dst = (u32*)(ob + (long)(q_start + rowA + 8) * o_st);
#pragma unroll
        for (int i = 0; i < 16; ++i)
            dst[4 * i] = pack2(acc[4 * i + 2] * iB, acc[4 * i + 3] * iB);
    }
#else
    // O through this warpgroup's (now unused) rows of the Q tile, swizzled like it (no bank
    // conflicts either way), then written out as whole 16-byte chunks of each row
    {
        const int ra = 64 * w + 16 * warp + qr, rb = ra + 8;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 half = sq + (i >> 3) * Q_HALF + 4 * qc;
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(swz(half, ra, i & 7)),
                         "r"(pack2(acc[4 * i] * iA, acc[4 * i + 1] * iA)) : "memory");
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(swz(half, rb, i & 7)),
                         "r"(pack2(acc[4 * i + 2] * iB, acc[4 * i + 3] * iB)) : "memory");
        }
    }
    named_sync(3 + w, 128);
    u16* ob = o + (long)h * o_sh;
#pragma unroll
    for (int k = 0; k < 64 * 16 / 128; ++k) {
        const int idx = tw + 128 * k, r = idx >> 4, cc = idx & 15;
        const int row = m0 + 64 * w + r, tok = row / GRP, g = row % GRP;
        uint4 val;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                     : "r"(swz(sq + (cc >> 3) * Q_HALF, 64 * w + r, cc & 7)) : "memory");
        if (row < n) *(uint4*)(ob + (long)(q_start + tok) * o_st + (long)g * o_sh + cc * 8) = val;
    }
#endif
#endif  // SPLIT
#else
    asm volatile("trap;\n");  // built without sm_90a features: fail loudly, never return zeros
#endif
}
