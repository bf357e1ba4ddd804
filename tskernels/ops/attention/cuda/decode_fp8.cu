// Paged GQA decode over an fp8-e4m3 KV cache with warp-level e4m3 tensor-core MMAs
// (mma.sync m16n8k32, sm_89+; built for sm_90 and run on the H200, compile-checked for sm_100 /
// sm_120). Head dim 128, up to 8 query heads per KV head.
//
// One CTA = (split, KV head, request) with NW warps. Each warp streams its own 32-key slices
// of the split (slice i of warp w starts at 32 * (NW * i + w)) through its own STAGES-deep
// cp.async ring in shared memory (16-byte chunks, XOR-swizzled rows so ldmatrix is
// conflict-free) and keeps its own online softmax: no CTA-wide barrier until the warps are
// combined once at the end.
//
// Neither K nor V is ever converted to 16 bits:
//  * s = q K^T: the A operand's 16 rows hold the G query heads twice, rows 0..G-1 as
//    hi = e4m3(q * qs) and rows 8..8+G-1 as lo = e4m3((q * qs - hi) * rs) (per-head scales),
//    so one MMA gives both partial logits and s = hi_part / qs + lo_part / (qs * rs) keeps
//    ~8 significant bits of q. K rows (keys) are the B operand straight from ldmatrix.
//  * o += p V: P is the A operand, split hi/lo the same way (p * 256 and its residual * 16)
//    and taken from the logits' accumulator registers with no shuffles: the K (key) order of
//    the MMA is permuted so that each thread's own logits fill its A slots. V must then be
//    K-major in that permuted order: ldmatrix.trans of 8x8 blocks of 16-bit pairs followed by
//    byte permutes (prmt) delivers exactly that, with the output columns of each MMA being the
//    even or the odd head-dim positions of a 16-wide chunk.
// Split-KV partials (fp32, normalised, natural-log lse) use the Triton decode's layout and
// merge kernel (a programmatic dependent launch on sm_90+).

#ifndef NW
#define NW 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef MINB
#define MINB 1                 // CTAs per SM the register allocation must allow
#endif
#define HD 128                 // head dim
#define CHUNKS (HD / 16)       // 16-byte chunks per key row
#define TK (32 * NW)           // keys per tile
#define WARP_STAGE (2 * 32 * HD)  // one warp's K + V rows of one stage

#include "cuda_common.cuh"  // u32 / u16, NEG_INF, smem_addr, quad_max / quad_sum

typedef unsigned char u8;

// (these cp.async wrappers carry no "memory" clobber, unlike hopper_common.cuh's: kept as the
// kernel was measured; a clobber constrains how the compiler may schedule around them)
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int nbytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(nbytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// c += a (16x32 e4m3, row) * b (32x8 e4m3, col), fp32 accumulate
__device__ __forceinline__ void mma_e4m3(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// two floats -> two e4m3 bytes (x0 in the low byte), round to nearest, saturating
__device__ __forceinline__ u32 e4m3x2(float x0, float x1) {
    u16 d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(x1), "f"(x0));
    return (u32)d;
}
// e4m3 pair (low byte first) -> two floats
__device__ __forceinline__ void e4m3x2_to_f32(u32 v, float& x0, float& x1) {
    u32 h2;
    u16 lo16 = (u16)(v & 0xffffu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(lo16));
    u16 a = (u16)(h2 & 0xffffu), b = (u16)(h2 >> 16);
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(x0) : "h"(a));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(x1) : "h"(b));
}
// four floats -> (hi, lo) e4m3 words: hi = e4m3(x * s), lo = e4m3((x * s - hi) * r)
__device__ __forceinline__ void split4(const float* x, float s, float r, u32& hi, u32& lo) {
    float y[4], res[4];
    for (int i = 0; i < 4; ++i) y[i] = x[i] * s;
    u32 h01 = e4m3x2(y[0], y[1]), h23 = e4m3x2(y[2], y[3]);
    float b0, b1, b2, b3;
    e4m3x2_to_f32(h01, b0, b1);
    e4m3x2_to_f32(h23, b2, b3);
    res[0] = (y[0] - b0) * r; res[1] = (y[1] - b1) * r;
    res[2] = (y[2] - b2) * r; res[3] = (y[3] - b3) * r;
    hi = h01 | (h23 << 16);
    lo = e4m3x2(res[0], res[1]) | (e4m3x2(res[2], res[3]) << 16);
}

__device__ __forceinline__ float load_q(const u16* p, int bf16) {
    u16 v = *p;
    if (bf16) return __uint_as_float(((u32)v) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ u16 store_q(float x, int bf16) {
    u16 v;
    if (bf16) asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(v) : "f"(x));
    else asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(v) : "f"(x));
    return v;
}


#ifdef TIMING
// Diagnostics build only (-DTIMING=max CTAs): per CTA, globaltimer stamps at entry, when warp 0's
// first tile landed, when warp 0 left its loop and at exit, plus the SM id
// (benchmarks/cta_timeline.py reads them back).
__device__ unsigned long long cta_times[TIMING * 5];
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define STAMP(i)                                                                           \
    do {                                                                                   \
        const int cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);  \
        if (cta_ < TIMING) cta_times[cta_ * 5 + (i)] = gtime();                           \
    } while (0)
#else
#define STAMP(i) do {} while (0)
#endif

extern "C" __global__ void __launch_bounds__(NW * 32, MINB)
decode_fp8_kernel(const u16* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ vc,
                  const int* __restrict__ pt, const int* __restrict__ lens,
                  const float* __restrict__ ks, const float* __restrict__ vs,
                  u16* __restrict__ out, float* __restrict__ po, float* __restrict__ plse,
                  float sm_scale, int num_splits, int G, int page_size, int page_shift,
                  int per_head, int q_bf16,
                  long long q_sb, long long q_sh, long long k_sp, long long k_ss, long long k_sh,
                  long long v_sp, long long v_ss, long long v_sh, long long pt_sb,
                  long long o_sb, long long o_sh) {
    extern __shared__ __align__(128) u8 smem[];
    if (threadIdx.x == 0) STAMP(0);
#if __CUDA_ARCH__ >= 900
    // the split-KV merge is a programmatic dependent launch: let it be scheduled now (it
    // waits for this grid's completion and memory before reading the partials)
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int hq = gridDim.y * G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int L = lens[b];
    const int per = (L + num_splits - 1) / num_splits;
    const int chunk = (per + TK - 1) / TK * TK;
    const int start = split * chunk;
    const int end = min(start + chunk, L);
    const float LOG2E = 1.4426950408889634f;

    // ---- q as two e4m3 rows per head (thread (g, t) holds head g's columns 4t.. of each
    //      16-wide half of every 32-wide k-step)
    u32 qa[HD / 32][4];
    float inv_hi = 0.f, inv_lo = 0.f;
    {
        float x[HD / 32][2][4];
        float mx = 0.f;
        const u16* qrow = q + (long long)b * q_sb + (long long)(kvh * G + (g < G ? g : 0)) * q_sh;
        for (int s = 0; s < HD / 32; ++s)
            for (int h = 0; h < 2; ++h)
                for (int i = 0; i < 4; ++i) {
                    float v = g < G ? load_q(qrow + 32 * s + 16 * h + 4 * t + i, q_bf16) : 0.f;
                    x[s][h][i] = v;
                    mx = fmaxf(mx, fabsf(v));
                }
        mx = quad_max(mx);
        const float qs = mx > 0.f ? 448.f / mx : 1.f;
        // the residual's scale from its own max |q * qs - hi|
        float rmx = 0.f;
        for (int s = 0; s < HD / 32; ++s)
            for (int h = 0; h < 2; ++h) {
                float y0 = x[s][h][0] * qs, y1 = x[s][h][1] * qs;
                float y2 = x[s][h][2] * qs, y3 = x[s][h][3] * qs;
                float b0, b1, b2, b3;
                e4m3x2_to_f32(e4m3x2(y0, y1), b0, b1);
                e4m3x2_to_f32(e4m3x2(y2, y3), b2, b3);
                rmx = fmaxf(rmx, fmaxf(fmaxf(fabsf(y0 - b0), fabsf(y1 - b1)),
                                       fmaxf(fabsf(y2 - b2), fabsf(y3 - b3))));
            }
        rmx = quad_max(rmx);
        const float rs = rmx > 0.f ? 448.f / rmx : 1.f;
        for (int s = 0; s < HD / 32; ++s) {
            split4(x[s][0], qs, rs, qa[s][0], qa[s][1]);
            split4(x[s][1], qs, rs, qa[s][2], qa[s][3]);
            if (g >= G) qa[s][0] = qa[s][1] = qa[s][2] = qa[s][3] = 0u;
        }
        const float kscale = ks[per_head ? kvh : 0];
        const float qk = sm_scale * kscale * LOG2E;
        inv_hi = qk / qs;
        inv_lo = qk / (qs * rs);
    }

    // ---- Each warp streams its own keys through its own STAGES-deep cp.async ring (no
    //      CTA-wide barrier in the loop: the warps drift and overlap each other's latency).
    //      Warp w takes keys start + TK * i + 32 w .. + 31 of tile i; lane copies rows
    //      lane / CHUNKS + 4 u (u < 8), 16-byte column lane % CHUNKS, of K and of V.
    const u32 wbase = smem_addr(smem) + (u32)(warp * STAGES * WARP_STAGE);
    const int* ptrow = pt + (long long)b * pt_sb;
    const u8* kbase = kc + (long long)kvh * k_sh;
    const u8* vbase = vc + (long long)kvh * v_sh;
    const int first = start + 32 * warp;
    const int nt = first < end ? (end - first + TK - 1) / TK : 0;  // this warp's tiles
    const int col = lane % CHUNKS;
    // Page ids are loaded one tile ahead of the copies that use them: issued right before
    // the copies, their loads wait behind earlier copies in the memory pipeline.
    int pages[8];
    auto load_pages = [&](int tile) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int key = first + tile * TK + lane / CHUNKS + 4 * u;
            const int pi = page_shift >= 0 ? key >> page_shift : key / page_size;
            pages[u] = (tile < nt && key < end) ? __ldg(ptrow + pi) : 0;
        }
    };
    auto issue = [&](int tile) {
        if (tile < nt) {
            const int k0 = first + tile * TK;
            const u32 st = wbase + (u32)((tile % STAGES) * WARP_STAGE);
            int cur[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) cur[u] = pages[u];
            load_pages(tile + 1);
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int row = lane / CHUNKS + 4 * u;
                const int key = k0 + row;
                const bool ok = key < end;
                const long long page = cur[u];
                const int slot = page_shift >= 0 ? key & (page_size - 1) : key % page_size;
                const u32 off = (u32)(row * HD + ((col ^ (row & 7)) * 16));
                const u8* ks_ = kbase + page * k_sp + (long long)slot * k_ss + col * 16;
                const u8* vs_ = vbase + page * v_sp + (long long)slot * v_ss + col * 16;
                cp_async16(st + off, ok ? ks_ : kc, ok ? 16 : 0);
                cp_async16(st + 32 * HD + off, ok ? vs_ : vc, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    load_pages(0);

    float m = NEG_INF, l = 0.f;
    float acc[2 * CHUNKS][4];
#pragma unroll
    for (int n = 0; n < 2 * CHUNKS; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);

    for (int it = 0; it < nt; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        if (it == 0 && threadIdx.x == 0) STAMP(1);
        issue(it + STAGES - 1);  // into the stage this warp finished with last iteration
        const int kb = first + it * TK;  // this warp's first key of the tile
        {
            const u32 sk = wbase + (u32)((it % STAGES) * WARP_STAGE);
            const u32 sv = sk + 32 * HD;
            // s = q K^T for keys kb + 8j + (0..7): accumulator rows g (hi) / g + 8 (lo)
            float c[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
                const int row = 8 * j + (lane & 7);
#pragma unroll
                for (int h = 0; h < HD / 64; ++h) {
                    const int ch = 4 * h + (lane >> 3);
                    u32 r0, r1, r2, r3;
                    ldsm_x4(sk + (u32)(row * HD + ((ch ^ (row & 7)) * 16)), r0, r1, r2, r3);
                    mma_e4m3(c[j], qa[2 * h], r0, r1);
                    mma_e4m3(c[j], qa[2 * h + 1], r2, r3);
                }
            }
            float sv_[4][2];
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = kb + 8 * j + 2 * t + e;
                    float x = c[j][e] * inv_hi + c[j][2 + e] * inv_lo;
                    x = key < end ? x : NEG_INF;
                    sv_[j][e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = quad_max(mx);
            const float m_new = fmaxf(m, mx);
            const float alpha = exp2f(m - m_new);
            float p[4][2];
            float psum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    p[j][e] = exp2f(sv_[j][e] - m_new);
                    psum += p[j][e];
                }
            l = l * alpha + psum;
            m = m_new;
            if (__any_sync(0xffffffffu, alpha != 1.f)) {  // the max moved: rescale
#pragma unroll
                for (int n = 0; n < 2 * CHUNKS; ++n) {
                    acc[n][0] *= alpha; acc[n][1] *= alpha;
                    acc[n][2] *= alpha; acc[n][3] *= alpha;
                }
            }
            // P as the A operand: slots 4t..4t+3 <- keys 2t, 2t+1, 8+2t, 9+2t (n-tiles 0, 1),
            // slots 16+4t.. <- n-tiles 2, 3; rows g = hi (p * 256), g + 8 = lo (residual * 16)
            u32 pa[4];
            {
                const float x0[4] = {p[0][0], p[0][1], p[1][0], p[1][1]};
                const float x1[4] = {p[2][0], p[2][1], p[3][0], p[3][1]};
                split4(x0, 256.f, 16.f, pa[0], pa[1]);
                split4(x1, 256.f, 16.f, pa[2], pa[3]);
            }
            // V^T blocks: 4 matrices = key rows 0-7 / 8-15 / 16-23 / 24-31 of 16-byte chunk c
            const int vrow = 8 * (lane >> 3) + (lane & 7);
#pragma unroll
            for (int c2 = 0; c2 < CHUNKS; ++c2) {
                u32 r0, r1, r2, r3;
                ldsm_x4_t(sv + (u32)(vrow * HD + ((c2 ^ (vrow & 7)) * 16)), r0, r1, r2, r3);
                mma_e4m3(acc[2 * c2], pa, prmt(r0, r1, 0x6420u), prmt(r2, r3, 0x6420u));
                mma_e4m3(acc[2 * c2 + 1], pa, prmt(r0, r1, 0x7531u), prmt(r2, r3, 0x7531u));
            }
        }
    }
    cp_async_wait<0>();
    if (threadIdx.x == 0) STAMP(2);
    __syncthreads();  // every warp is done with its ring: reuse it for the combine

    // ---- combine the warps: per warp and head, m (log2 domain), l and the unnormalised o
    float* wm = reinterpret_cast<float*>(smem);            // [NW][8]
    float* wl = wm + NW * 8;                               // [NW][8]
    float* wo = wl + NW * 8;                               // [NW][8][HD]
    l = quad_sum(l);
    if (g < G) {
        if (t == 0) {
            wm[warp * 8 + g] = m;
            wl[warp * 8 + g] = l;
        }
        // acc[2c] holds d = 16c + 4t (+0, +2), acc[2c + 1] d = 16c + 4t + 1 (+3)
#pragma unroll
        for (int c2 = 0; c2 < CHUNKS; ++c2) {
            float* dst = wo + (warp * 8 + g) * HD + 16 * c2 + 4 * t;
            dst[0] = (acc[2 * c2][0] + acc[2 * c2][2] * (1.f / 16.f)) * (1.f / 256.f);
            dst[2] = (acc[2 * c2][1] + acc[2 * c2][3] * (1.f / 16.f)) * (1.f / 256.f);
            dst[1] = (acc[2 * c2 + 1][0] + acc[2 * c2 + 1][2] * (1.f / 16.f)) * (1.f / 256.f);
            dst[3] = (acc[2 * c2 + 1][1] + acc[2 * c2 + 1][3] * (1.f / 16.f)) * (1.f / 256.f);
        }
    }
    __syncthreads();
    const float vscale = vs[per_head ? kvh : 0];
    for (int idx = tid; idx < G * HD; idx += NW * 32) {
        const int h = idx / HD, d = idx % HD;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, wm[w * 8 + h]);
        float num = 0.f, den = 0.f;
        if (M != NEG_INF) {
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float f = exp2f(wm[w * 8 + h] - M);
                num += f * wo[(w * 8 + h) * HD + d];
                den += f * wl[w * 8 + h];
            }
        }
        const float o = den > 0.f ? num / den * vscale : 0.f;
        const int qh = kvh * G + h;
        if (num_splits == 1) {
            out[(long long)b * o_sb + (long long)qh * o_sh + d] = store_q(o, q_bf16);
        } else {
            const long long row = ((long long)b * hq + qh) * num_splits + split;
            po[row * HD + d] = o;
            if (d == 0)
                plse[row] = den > 0.f ? (M + log2f(den)) * 0.6931471805599453f : NEG_INF;
        }
    }
#ifdef TIMING
    __syncthreads();
    if (threadIdx.x == 0) {
        STAMP(3);
        u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const int cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        if (cta_ < TIMING) cta_times[cta_ * 5 + 4] = sm;
    }
#endif
}
