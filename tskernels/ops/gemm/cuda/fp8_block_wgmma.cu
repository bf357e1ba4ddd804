// Block-scaled fp8 GEMM for Hopper (sm_90a), DeepSeek-V3 layout: c[M, N] = sum over 128-wide
// K blocks kb of (A[:, kb] B[:, kb]^T) * a_scale[m, kb] * b_scale[n / 128, kb], with A e4m3
// [M, K] (1 x 128 activation groups) and B e4m3 [N, K] (128 x 128 weight blocks), fp32
// accumulation, bf16 (default), fp16 (-DOUT_F16) or fp32 (-DOUT_F32) output.
//
// Why CUDA: each K block's product must be scaled before it joins the accumulator, so the
// MMA result lands in a temporary and is "promoted" on the CUDA cores. Triton 3.6 on sm_90
// waits for every wgmma and then runs the promotion with the tensor cores idle (0.61-0.78x
// cuBLAS at M = 4096, benchmarks/RESULTS.md "Issue 24, second approaches", part 4). Here two
// consumer warpgroups take turns: while one promotes its 64 rows, the other's MMAs run.
//
// Persistent CTAs (grid = min(tiles, SMs)) of 384 threads walk the [BM x BN] output tiles in
// grouped order (group_m tile rows at a time, for L2 reuse of the weight tiles), tile
// t = blockIdx.x + i * gridDim.x:
//  * warpgroup 0 (producer) gives its registers away (setmaxnreg); its warp 0 fills a
//    STAGES-deep ring: lane 0 issues the TMA copies of the A [BM x 128] and B [BN x 128] boxes
//    (128-byte swizzle, rows past M / N and columns past K read as zeros) and every lane copies
//    a slice of the stage's scales (BM activation scales, BN / 128 weight scales) into shared
//    memory with cp.async; the stage's "full" mbarrier completes on 33 arrivals (lane 0's, and
//    each lane's once its copies land) and the TMA bytes, so the warp never waits on a load;
//  * warpgroups 1 and 2 (consumers) own rows 0..63 and 64..127 of the tile. Per K block and
//    128-column half h: 4 x wgmma m64n128k32 (e4m3, both operands K-major from shared memory)
//    into t, wait, then acc[h] += t * (a_scale[row] * b_scale[h]); the stage is released
//    (256 arrivals on "empty") once its last MMA is in. -DPIPE (BN = 128 only) keeps two
//    temporaries: block kb's MMAs run while block kb - 1 is promoted.
//  * the epilogue (16-bit c with 16-byte-aligned rows, `cmap` given) writes each consumer's
//    64 rows 64 columns at a time into a swizzled shared buffer (CBUF per consumer) and one
//    thread stores the box with TMA (asynchronous, clipped at M / N), while the producer
//    already loads the next tile's stages. Direct stores from registers, one 4-byte pair per
//    thread and row (8 rows x 16 bytes per warp instruction), cost ~2.5 us per tile on the H200
//    (the per-tile overhead at K = 2048); they remain for fp32 c and unaligned rows.
// One-pass tiles (-DBN=144 / 160 / 176 / 192): per K block one batch of 4 x wgmma m64nBNk32
// into a BN / 2-value temporary, promoted column group by column group with the weight scale
// of the 128-block the group lies in (a tile starts on any 16-column boundary, so it meets up
// to three). They exist for the wave count: N = 2112 is 8 tiles of 256 plus a 64-wide column
// (288 tiles on 132 SMs at M = 4096: 2.5 tile-times for 2.06 of work), but exactly 12 tiles of
// 176 (384 tiles, 3 waves of 0.69 tile-times). The last BN % 64 columns of a tile are stored
// directly from registers (a 64-column TMA box would write into the next tile).
// -DCLUSTER=2: CTA pairs (a cluster) take vertically adjacent tiles of one tile column, in
// lockstep; each CTA's producer loads half of the shared B tile and multicasts it into both
// CTAs, so a CTA reads A + B / 2 per stage from L2 instead of A + B. A stage is then released
// by both CTAs' consumers (one elected thread per warpgroup arrives on its own CTA's and on the
// peer's "empty" barrier), and the pair leaves together. Measured slower than single CTAs on
// the H200 (L2 traffic was not the limit; benchmarks/RESULTS.md, "Session 16"): kept for sweeps.
// Options (-D): BN (128 / 256; one pass 144 / 160 / 176 / 192), STAGES, PIPE, CLUSTER (1 / 2), OUT_F16 / OUT_F32. Shared
// helpers (mbarriers, TMA, descriptors, fences): hopper_common.cuh.

#ifndef BN
#define BN 128
#endif
#ifndef STAGES
#define STAGES (BN == 128 ? 6 : 4)
#endif
#if BN == 128 || BN == 256
#define ONE_PASS 0                 // whole 128-column weight-scale blocks, one MMA batch each
#elif BN == 144 || BN == 160 || BN == 176 || BN == 192
#define ONE_PASS 1                 // one m64nBNk32 batch per K block, scales per 8 columns
#else
#error "BN must be 128 or 256, or 144 / 160 / 176 / 192 (one pass)"
#endif
#ifndef CLUSTER
#define CLUSTER 1
#endif
#if CLUSTER != 1 && CLUSTER != 2
#error "CLUSTER must be 1 or 2"
#endif
#if ONE_PASS && (CLUSTER != 1 || defined(PIPE))
#error "one-pass BN: no cluster, no PIPE"
#endif
#if defined(PIPE) && BN != 128
#error "PIPE (two temporaries) needs BN = 128 (registers: 3 x 64 accumulators)"
#endif
#define DT "bf16"                  // hopper_common.cuh's 16-bit MMA wrappers (unused here)
#ifdef OUT_F16
#define CVT_PACK "cvt.rn.f16x2.f32"
#else
#define CVT_PACK "cvt.rn.bf16x2.f32"
#endif
#define BM 128                     // tile rows: two consumer warpgroups x 64
#define BK 128                     // one activation / weight scale block of K per stage
#define NH (BN / 128)              // 128-column halves of a tile (one weight scale each)
#define NSC (ONE_PASS ? 3 : NH)    // weight scales a stage carries (one pass: <= 3 blocks)
#define A_TILE (BM * BK)           // bytes (e4m3)
#define B_TILE (BN * BK)
#define STAGE_BYTES (A_TILE + B_TILE)
#define SC_FLOATS (BM + 8)         // a stage's scales: BM activation, NSC weight (padded)
#ifndef CBUF
#define CBUF 1                     // 64-column C staging buffers per consumer warpgroup
#endif
#define C_CHUNK (64 * 128)         // a consumer's 64 rows x 64 16-bit columns (128-byte rows)
#define C_OFFSET (STAGES * STAGE_BYTES)
#define SC_OFFSET (C_OFFSET + 2 * CBUF * C_CHUNK)
#define BAR_OFFSET (SC_OFFSET + STAGES * SC_FLOATS * 4)
#define SMEM_BYTES (BAR_OFFSET + 16 * STAGES + 1024)  // + alignment slack
#define PRODUCER_REGS 40           // 40 + 2 x 232 registers per thread <= 512
#define CONSUMER_REGS 232

#include "hopper_common.cuh"

// d (+)= A (smem, K-major) * B (smem, K-major), e4m3 x e4m3 -> f32: [64 x 32] x [32 x 128]
__device__ __forceinline__ void wgmma_e4m3_m64n128(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

#if ONE_PASS
// the one-pass tile's MMA: [64 x 32] x [32 x BN] (BN / 2 accumulators per thread)
#if BN == 144
__device__ __forceinline__ void wgmma_e4m3_m64n144(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n144k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71}, %72, %73, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif
#if BN == 160
__device__ __forceinline__ void wgmma_e4m3_m64n160(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79}, %80, %81, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif
#if BN == 176
__device__ __forceinline__ void wgmma_e4m3_m64n176(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}, %88, %89, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif
#if BN == 192
__device__ __forceinline__ void wgmma_e4m3_m64n192(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif
#define wgmma_e4m3_wide(d, da, db, acc) WGMMA_WIDE(BN)(d, da, db, acc)
#define WGMMA_WIDE(n) WGMMA_WIDE_(n)
#define WGMMA_WIDE_(n) wgmma_e4m3_m64n##n
#endif

// TMA store of a {64 columns, 64 rows} box from shared memory (128-byte swizzled by the map),
// clipped at the tensor's edges; bulk groups let the issuing thread wait until the shared
// buffer has been read (wait_read) or the stores are done (at exit)
__device__ __forceinline__ void tma_store(const TensorMap* map, u32 src, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 :: "l"((u64)map), "r"(col), "r"(row), "r"(src) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// 4-byte asynchronous copy global -> shared (nbytes 0: zero fill), and the arrival on an
// mbarrier once all of this thread's earlier asynchronous copies are in (noinc: the barrier's
// count includes it)
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int nbytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(nbytes) : "memory");
}
__device__ __forceinline__ void cp_async_arrive_noinc(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}

// a consumer warpgroup frees a stage: its leader (thread 0) arrives for all 128 threads on
// this CTA's "empty" barrier (and, in a cluster, on the peer's, whose producer multicasts into
// this CTA too). One arrival suffices: no thread passes wgmma.wait_group before the whole
// warpgroup has issued the stage's MMAs, and each thread reads its scales before issuing.
// Predicated inside the asm: a C++ branch between asynchronous MMAs makes ptxas serialise them.
__device__ __forceinline__ void release_stage(u32 bar, int leader, u32 peer) {
    asm volatile("{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.b32 p, %1, 0;\n"
                 "@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n"
                 :: "r"(bar), "r"(leader) : "memory");
#if CLUSTER == 2
    asm volatile("{\n.reg .pred p;\n.reg .b32 r;\nsetp.ne.b32 p, %1, 0;\n"
                 "mapa.shared::cluster.u32 r, %0, %2;\n"
                 "@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n}\n"
                 :: "r"(bar), "r"(leader), "r"(peer) : "memory");
#endif
}

#if CLUSTER == 2
__device__ __forceinline__ u32 cluster_reg_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
                 ::: "memory");
}
// tma_load into the same shared offset of every CTA in `mask`, completing bytes on each one's
// mbarrier at `bar`'s offset
__device__ __forceinline__ void tma_load_multicast(u32 dst, const TensorMap* map, int col,
                                                   int row, u32 bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(dst), "l"((u64)map), "r"(col), "r"(row), "r"(bar), "h"(mask)
                 : "memory");
}
#endif

// work item t: grouped order (group_m tile rows at a time, down each column of the group)
// over the tile columns, except that with `narrow` the last column (at most half a tile wide:
// its second half skips its MMAs) comes after all the others, so its cheaper tiles fill the
// last, partial wave of the persistent grid
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int group_m,
                                            int narrow, int& mb, int& nb) {
    const int wide_n = tiles_n - narrow, wide = tiles_m * wide_n;
    if (t >= wide) {
        mb = t - wide;
        nb = tiles_n - 1;
        return;
    }
    const int per_group = group_m * wide_n, g = t / per_group, first = g * group_m;
    const int rows = min(tiles_m - first, group_m), r = t - g * per_group;
    mb = first + r % rows;
    nb = r / rows;
}

template <int N>
__device__ __forceinline__ void fence_regs(float* x) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(x[i]);
}

// d = 4 MMAs over one 128-deep K block: A rows of this warpgroup (sa), B rows of half h (sb)
__device__ __forceinline__ void issue_block(float* d, u32 sa, u32 sb) {
    fence_regs<64>(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        wgmma_e4m3_m64n128(d, desc(sa + kk * 32, 16, 1024), desc(sb + kk * 32, 16, 1024), kk > 0);
    wgmma_commit();
}

// acc (one 128-column half: 64 values) += t * scale of its row (s0: row r, s1: row r + 8)
__device__ __forceinline__ void promote(float* acc, const float* t, float s0, float s1) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        acc[4 * i] = fmaf(t[4 * i], s0, acc[4 * i]);
        acc[4 * i + 1] = fmaf(t[4 * i + 1], s0, acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(t[4 * i + 2], s1, acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(t[4 * i + 3], s1, acc[4 * i + 3]);
    }
}

#if ONE_PASS
// d = 4 MMAs over one 128-deep K block, all BN columns of the tile in one batch
__device__ __forceinline__ void issue_block_wide(float* d, u32 sa, u32 sb) {
    fence_regs<BN / 2>(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        wgmma_e4m3_wide(d, desc(sa + kk * 32, 16, 1024), desc(sb + kk * 32, 16, 1024), kk > 0);
    wgmma_commit();
}

// acc += t * (row scale x weight scale of the column's 128-block): a one-pass tile starts
// anywhere on a 16-column boundary, so it meets up to three weight-scale blocks (b0, b1, b2);
// cut1 / cut2 are the tile columns where the second / third begins. Column group g (tile
// columns 8 g .. 8 g + 7, values 4 g .. 4 g + 3) lies in one block (BN and cuts are multiples
// of 16).
__device__ __forceinline__ void promote_wide(float* acc, const float* t, float a0, float a1,
                                             float b0, float b1, float b2, int cut1, int cut2) {
#pragma unroll
    for (int g = 0; g < BN / 8; ++g) {
        const float bs = 8 * g < cut1 ? b0 : (8 * g < cut2 ? b1 : b2);
        const float s0 = a0 * bs, s1 = a1 * bs;
        acc[4 * g] = fmaf(t[4 * g], s0, acc[4 * g]);
        acc[4 * g + 1] = fmaf(t[4 * g + 1], s0, acc[4 * g + 1]);
        acc[4 * g + 2] = fmaf(t[4 * g + 2], s1, acc[4 * g + 2]);
        acc[4 * g + 3] = fmaf(t[4 * g + 3], s1, acc[4 * g + 3]);
    }
}
#endif

// two adjacent outputs (x: column col, y: col + 1) of row `row`; pair: col + 1 < N and the
// pair is aligned for one store
__device__ __forceinline__ void store2(void* c, long off, float x, float y, bool pair,
                                       bool second) {
#if defined(OUT_F32)
    float* p = (float*)c + off;
    if (pair) { *(float2*)p = make_float2(x, y); } else { p[0] = x; if (second) p[1] = y; }
#else
    u16* p = (u16*)c + off;
    const u32 v = pack2(x, y);
    if (pair) { *(u32*)p = v; } else { p[0] = (u16)(v & 0xffffu); if (second) p[1] = (u16)(v >> 16); }
#endif
}

#ifdef PIPE
// wait for ring slot of block i, read its scales (s0 / s1: rows r0 / r0 + 8 times the weight
// scale), issue its MMAs into d
__device__ __forceinline__ void stage_issue(float* d, float& s0, float& s1, u32 ring,
                                            const float* scales, u32 bars, int i, int w, int r0) {
    const int s = i % STAGES;
    mbar_wait_uniform(bars + 8 * s, (i / STAGES) & 1);
    const float* sc = scales + s * SC_FLOATS;
    s0 = sc[r0] * sc[BM];
    s1 = sc[r0 + 8] * sc[BM];
    const u32 st = ring + s * STAGE_BYTES;
    issue_block(d, st + (r0 / 64) * 64 * 128, st + A_TILE);
}
// once at most PENDING groups are in flight, block i (in d) is in: free its slot, promote it
template <int PENDING>
__device__ __forceinline__ void stage_finish(float* acc, float* d, float s0, float s1, u32 bars,
                                             int i, int leader, u32 peer) {
    wgmma_wait<PENDING>();
    fence_regs<64>(d);
    release_stage(bars + 8 * (STAGES + i % STAGES), leader, peer);
    promote(acc, d, s0, s1);
}
#endif

// amap: A as a 2-D [M, K] byte tensor, boxes of 128 columns x BM rows; bmap: B [N, K], boxes
// of 128 x BN / CLUSTER rows. a_scale [M, KB] (row stride as_st), b_scale [ceil(N / 128), KB] (row
// stride bs_st), fp32. c [M, N] with row stride ldc (elements); vec2: ldc even and c 4-byte
// (8 for fp32) aligned, so column pairs go out as one store; tma_c: store through cmap (c as
// a 2-D tensor, boxes of 64 x 64, 128-byte swizzle; 16-bit c only) instead. narrow: 1 when
// the last tile column holds at most BN / 2 columns (it is walked last, see tile_coords).
extern "C" __global__ void __launch_bounds__(384, 1)
#if CLUSTER == 2
__cluster_dims__(2, 1, 1)
#endif
fp8_block_mm_kernel(const __grid_constant__ TensorMap amap, const __grid_constant__ TensorMap bmap,
                    const __grid_constant__ TensorMap cmap,
                    const float* __restrict__ a_scale, const float* __restrict__ b_scale,
                    void* __restrict__ c, int M, int N, int KB, long ldc, long as_st,
                    long bs_st, int tiles_m, int tiles_n, int group_m, int narrow, int vec2,
                    int tma_c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
    const u32 ring = base, bars = base + BAR_OFFSET;
    float* const scales = (float*)(smem_raw + (base - raw) + SC_OFFSET);  // [STAGES][SC_FLOATS]
    const u32 scales_s = base + SC_OFFSET;                                // the same, shared
    // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)
    const int tid = threadIdx.x, wg = tid >> 7;
#if CLUSTER == 2
    // a work item is a pair of vertically adjacent tiles: this CTA takes row block 2 i + rank
    const u32 rank = cluster_reg_rank(), peer = rank ^ 1;
    u32 cid, ncl;
    asm volatile("mov.u32 %0, %%clusterid.x;\nmov.u32 %1, %%nclusterid.x;\n"
                 : "=r"(cid), "=r"(ncl));
    const int first = cid, step = ncl, items_m = (tiles_m + 1) / 2;
#else
    const u32 rank = 0, peer = 0;
    const int first = blockIdx.x, step = gridDim.x, items_m = tiles_m;
#endif
    const int num_items = items_m * tiles_n;
#ifdef PIPE
    const int KBP = KB + (KB & 1);  // K blocks per tile, padded to even (see the main loop)
#else
    const int KBP = KB;
#endif
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 33);  // the TMA lane (+ bytes), every lane's scale copies
            mbar_init(bars + 8 * (STAGES + s), 2 * CLUSTER);  // consumer warpgroup leaders
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#if CLUSTER == 2
    cluster_sync();  // the peer's barriers are initialised before anything multicasts into it
#else
    __syncthreads();
#endif

    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(PRODUCER_REGS));
        if (tid < 32) {
            const int lane = tid;
            int it = 0;  // K blocks issued by this CTA so far (ring slot and phase)
            for (int item = first; item < num_items; item += step) {
                int mb, nb;
                tile_coords(item, items_m, tiles_n, group_m, narrow, mb, nb);
                const int m0 = (mb * CLUSTER + (int)rank) * BM, n0 = nb * BN;
                for (int kb = 0; kb < KBP; ++kb, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) - 1) & 1);
                    const u32 dst = ring + s * STAGE_BYTES, full = bars + 8 * s;
                    if (lane == 0) {
                        mbar_expect_tx(full, STAGE_BYTES);  // own A, all of B (+ 1 arrival)
                        tma_load(dst, &amap, kb * BK, m0, full);
#if CLUSTER == 2
                        tma_load_multicast(dst + A_TILE + rank * (B_TILE / 2), &bmap, kb * BK,
                                           n0 + (int)rank * (BN / 2), full, 0x3);
#else
                        tma_load(dst + A_TILE, &bmap, kb * BK, n0, full);
#endif
                    }
                    // the stage's scales as asynchronous copies, each lane's completion one
                    // arrival on "full": the warp never waits for their latency (plain loads
                    // here serialised every stage behind one L2 round trip; zero fill past M /
                    // N / K, from an in-bounds address)
                    const u32 sc = scales_s + s * SC_FLOATS * 4;
                    const int kc = min(kb, KB - 1);
#pragma unroll
                    for (int j = 0; j < BM / 32; ++j) {
                        const int r = m0 + lane + 32 * j;
                        cp_async4(sc + 4 * (lane + 32 * j), a_scale + min(r, M - 1) * as_st + kc,
                                  r < M && kb < KB ? 4 : 0);
                    }
                    if (lane < NSC) {
                        // weight-scale block `lane` of the tile (the first holds column n0)
                        const int nbk = n0 / 128 + lane;
                        cp_async4(sc + 4 * (BM + lane), b_scale + min(nbk, (N - 1) / 128) * bs_st + kc,
                                  nbk * 128 < N && kb < KB ? 4 : 0);
                    }
                    cp_async_arrive_noinc(full);
                }
            }
        }
    } else {  // consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(CONSUMER_REGS));
    const int w = wg - 1, tw = tid - 128 * wg, warp = tw >> 5, lane = tw & 31;
    const int r0 = 64 * w + 16 * warp + (lane >> 2), q = lane & 3;  // rows r0, r0 + 8 (tile)
    const int leader = tw == 0;  // arrives on the "empty" barriers for the warpgroup
    float acc[BN / 2];
#ifdef PIPE
    float ta[64], tb[64];
#elif ONE_PASS
    float t[BN / 2];
#else
    float t[64];
#endif
    int it = 0;  // K blocks consumed so far (ring slot and phase), as the producer counts
    for (int item = first; item < num_items; item += step) {
        int mb, nb;
        tile_coords(item, items_m, tiles_n, group_m, narrow, mb, nb);
        const int m0 = (mb * CLUSTER + (int)rank) * BM, n0 = nb * BN;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
#ifdef PIPE
        // K blocks in pairs: both blocks' MMAs are issued (into ta / tb), then the first is
        // promoted while the second's MMAs still run. ptxas serialises every wgmma when a
        // temporary is read with its MMAs pending across the loop's back edge (a pipeline
        // of one block in flight over iterations), so the pair is the software pipeline; the
        // producer pads every tile to an even number of blocks (KBP; a padded block is all
        // zeros past K, with zero scales).
        for (int kb = 0; kb < KBP; kb += 2) {
            float pa0, pa1, pb0, pb1;  // scale products of the blocks in ta / tb
            stage_issue(ta, pa0, pa1, ring, scales, bars, it + kb, w, r0);
            stage_issue(tb, pb0, pb1, ring, scales, bars, it + kb + 1, w, r0);
            stage_finish<1>(acc, ta, pa0, pa1, bars, it + kb, leader, peer);
            stage_finish<0>(acc, tb, pb0, pb1, bars, it + kb + 1, leader, peer);
        }
        it += KBP;
#elif ONE_PASS
        const int cut1 = 128 - (n0 & 127), cut2 = cut1 + 128;
        for (int kb = 0; kb < KB; ++kb, ++it) {
            const int s = it % STAGES;
            mbar_wait_uniform(bars + 8 * s, (it / STAGES) & 1);
            const float* sc = scales + s * SC_FLOATS;
            const float a0 = sc[r0], a1 = sc[r0 + 8];
            const float b0 = sc[BM], b1 = sc[BM + 1], b2 = sc[BM + 2];
            const u32 st = ring + s * STAGE_BYTES;
            issue_block_wide(t, st + w * 64 * 128, st + A_TILE);
            wgmma_wait<0>();
            fence_regs<BN / 2>(t);
            release_stage(bars + 8 * (STAGES + s), leader, peer);
            promote_wide(acc, t, a0, a1, b0, b1, b2, cut1, cut2);
        }
#else
        for (int kb = 0; kb < KB; ++kb, ++it) {
            const int s = it % STAGES;
            mbar_wait_uniform(bars + 8 * s, (it / STAGES) & 1);
            const float* sc = scales + s * SC_FLOATS;
            const float a0 = sc[r0], a1 = sc[r0 + 8];
            const u32 st = ring + s * STAGE_BYTES;
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                // a half wholly past N (the narrow last tile column) skips its MMAs: uniform,
                // and no MMA is in flight across the branch
                const bool live = h == 0 || n0 + 128 * h < N;
                const float bs = sc[BM + h];
                if (live) {
                    issue_block(t, st + w * 64 * 128, st + A_TILE + h * 128 * 128);
                    wgmma_wait<0>();
                    fence_regs<64>(t);
                }
                if (h == NH - 1) release_stage(bars + 8 * (STAGES + s), leader, peer);
                if (live) promote(acc + 64 * h, t, a0 * bs, a1 * bs);
            }
        }
#endif
#if !defined(OUT_F32)
        if (tma_c) {  // uniform: every thread of the launch takes the same side
            const u32 cb = base + C_OFFSET + w * CBUF * C_CHUNK;
            const int rl = 16 * warp + (lane >> 2);  // row r0 inside this warpgroup's 64
#pragma unroll
            for (int j = 0; j < BN / 64; ++j) {
                const u32 buf = cb + (j % CBUF) * C_CHUNK;
                if (tw == 0) bulk_wait_read<CBUF - 1>();  // the store that last read buf is done
                named_sync(1 + w, 128);
#pragma unroll
                for (int i = 0; i < 8; ++i) {  // column group 8 j + i: acc[4 (8 j + i) ..]
                    const int g = 8 * j + i;
                    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(swz(buf, rl, i) + 4 * q),
                                 "r"(pack2(acc[4 * g], acc[4 * g + 1])) : "memory");
                    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(swz(buf, rl + 8, i) + 4 * q),
                                 "r"(pack2(acc[4 * g + 2], acc[4 * g + 3])) : "memory");
                }
                fence_async_shared();  // before the TMA (async proxy) reads them
                named_sync(1 + w, 128);
                if (tw == 0) {
                    tma_store(&cmap, buf, n0 + 64 * j, m0 + 64 * w);
                    bulk_commit();
                }
            }
            // a one-pass tile's last BN % 64 columns: direct stores below (a 64-wide box
            // would write into the next tile's columns)
            if (BN % 64 == 0) continue;
        }
#endif
        // epilogue: acc[4 j + e] is row r0 (e < 2) or r0 + 8, column 8 j + 2 q + (e & 1);
        // after the TMA-stored chunks, only the columns past them
        const int gr0 = m0 + r0, gr1 = gr0 + 8;
#if !defined(OUT_F32)
        const int j0 = tma_c ? 8 * (BN / 64) : 0;
#else
        const int j0 = 0;
#endif
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            if (j < j0) continue;
            const int col = n0 + 8 * j + 2 * q;
            if (col < N) {
                const bool second = col + 1 < N, pair = second && vec2;
                if (gr0 < M) store2(c, gr0 * ldc + col, acc[4 * j], acc[4 * j + 1], pair, second);
                if (gr1 < M)
                    store2(c, gr1 * ldc + col, acc[4 * j + 2], acc[4 * j + 3], pair, second);
            }
        }
    }
    if (tw == 0) bulk_wait_all();  // the shared buffers stay until the last stores read them
    }  // consumers
#if CLUSTER == 2
    cluster_sync();  // neither CTA leaves while its peer may still arrive on its barriers
#endif
#else
    asm volatile("trap;\n");  // built without sm_90a features: fail loudly, never return zeros
#endif
}
