// One-token fused experts for Hopper (sm_90a): gate-up, SiLU-mul, down and the weighted
// combine of the TOPK routed experts of one token in one launch, with each CTA's down-weight
// rows copied into shared memory by the TMA engine while the CTA streams its gate-up rows.
//
// Why: at T = 1 the two-launch Triton path (triton_direct.py) pays two ramps and tails: the
// down's 25 MB (Qwen3-30B-A3B) can only start streaming once the gate-up's 50 MB has produced
// the activations. The down weights do not depend on the activations, only on the routing, so
// here they are in flight from the first microsecond; what is left after the gate-up is one
// grid-wide arrival, a shared-memory dot product per row and the combine, all inside the CTA.
//
// Grid: G = TOPK x PARTS CTAs, one per SM (the shared-memory footprint allows one), blockIdx
// b = slot * PARTS + part. The two phases partition the work differently:
//   gate-up: CTA (slot j, part p), expert e = ids[j], computes the intermediate columns
//     n in [p*NI, p*NI + NI): act[j, n] = silu(x . w13[e, n]) * (x . w13[e, I + n]), rounded
//     to the 16-bit type (as the Triton paths round it), each warp one column pair at a time
//     with the next pair's 2 x H / 256 16-byte loads per lane in flight;
//   down: CTA b owns the output rows [b*R, b*R + R), R = ceil(H / G), for every slot: out[r] =
//     sum_j tw[j] * (act[j] . w2[ids[j], r]), summed in slot order (deterministic).
// So:
//   1. thread 0 issues TOPK cp.async.bulk copies, w2[ids[j]] rows [b*R, b*R + R) (contiguous,
//      R x I 16-bit values each), into shared memory, completing on one mbarrier;
//   2. the CTA stages x as fp32 in shared memory (its warps' first weight loads already in
//      flight) and streams its gate-up columns;
//   3. it counts itself into one grid-wide counter (release) and waits until all G CTAs have
//      (acquire): every slot's activation row is then in global memory;
//   4. it copies the TOPK activation rows (L2) into shared memory, waits for its down rows,
//      and warp w computes the weighted dot products of slots w, w + 8, ... with its R rows;
//   5. it sums the TOPK partials of each row in slot order and writes out.
// The spin in step 3 needs all G CTAs resident together: the grid is at most the SM count and
// one CTA fits an SM, and no other kernel this one waits for runs after it (this kernel never
// triggers a programmatic dependent early). The counters are returned to zero by their last
// user inside the launch, so graph replays start from zeros. Ids outside [0, E) contribute
// nothing (their CTAs stream nothing and still count in; nothing is copied for them).
// (Session 31's form had slot-local arrivals and a second, cross-CTA combine through global
// partials; this one trades those two hops for one grid-wide arrival.)
//
// Compile-time: HID (H), INTER (I), TOPK, PARTS, HALF (fp16 instead of bf16), IDS64 (int64
// ids), PDL (launched as a programmatic dependent: griddepcontrol.wait first), LATE_COPY (lab:
// the down rows copied only after step 3). H % 256 == 0 and I % 256 == 0 (lanes x 8 values).
#define DT "bf16"                  // hopper_common.cuh's MMA wrappers (unused here)
#define CVT_PACK "cvt.rn.bf16x2.f32"
#include "hopper_common.cuh"

#ifndef HID
#define HID 2048
#endif
#ifndef INTER
#define INTER 768
#endif
#ifndef TOPK
#define TOPK 8
#endif
#ifndef PARTS
#define PARTS 16
#endif

#define NWARPS 8
#define NTHREADS (NWARPS * 32)
#define GRID (TOPK * PARTS)
#define ROWS ((HID + GRID - 1) / GRID)       // output rows per CTA (every slot's)
#define NI ((INTER + PARTS - 1) / PARTS)     // intermediate column pairs per CTA
#define HCH (HID / 256)                      // 8-value chunks of x per lane
#define ICH (INTER / 256)                    // 8-value chunks of an act row per lane
#define COPY_BYTES 32768                     // one bulk copy's size (a multiple of 16)
#define RG 4                                 // down rows a warp reduces together

static_assert(HID % 256 == 0 && INTER % 256 == 0, "H and I must be multiples of 256");
static_assert((long long)TOPK * ROWS * INTER * 2 < (1 << 20),
              "down rows exceed the mbarrier's tx count");

#ifdef IDS64
typedef long long route_id;
#else
typedef int route_id;
#endif

// shared-memory layout (bytes): the down rows of every slot, x (fp32), the activation rows
// (16-bit), the per-slot partials (fp32), the mbarrier
#define SM_W2 0
#define SLOT_BYTES (ROWS * INTER * 2)
#define SM_X (SM_W2 + TOPK * SLOT_BYTES)
#define SM_ACT (SM_X + HID * 4)
#define SM_PART (SM_ACT + TOPK * INTER * 2)
#define SM_BAR ((SM_PART + TOPK * ROWS * 4 + 7) / 8 * 8)
#define SMEM_BYTES (SM_BAR + 8)

// a 16-bit value (bf16, or fp16 under HALF) as fp32; lo16 / hi16: the halves of a 32-bit word
__device__ __forceinline__ float f16(u16 h) {
#ifdef HALF
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float((u32)h << 16);
#endif
}
__device__ __forceinline__ float lo16(u32 v) { return f16((u16)(v & 0xffffu)); }
__device__ __forceinline__ float hi16(u32 v) {
#ifdef HALF
    return f16((u16)(v >> 16));
#else
    return __uint_as_float(v & 0xffff0000u);
#endif
}
__device__ __forceinline__ u16 round16(float f) {
    u16 h;
#ifdef HALF
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
#else
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
#endif
    return h;
}

// a weight row's 16 bytes, read once: no L1 allocation
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, float acc) {
    acc = fmaf(lo16(w.x), a.x, acc);
    acc = fmaf(hi16(w.x), a.y, acc);
    acc = fmaf(lo16(w.y), a.z, acc);
    acc = fmaf(hi16(w.y), a.w, acc);
    acc = fmaf(lo16(w.z), b.x, acc);
    acc = fmaf(hi16(w.z), b.y, acc);
    acc = fmaf(lo16(w.w), b.z, acc);
    return fmaf(hi16(w.w), b.w, acc);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_cg32(const u32* p) {
    u32 v;
    asm volatile("ld.global.cg.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ bool valid_id(long long e, int num_experts) {
    return e >= 0 && e < num_experts;
}

// thread 0: w2[ids[j]] rows [r0, r0 + nrows) of every valid slot j into shared memory,
// completing on the mbarrier; returns (in every thread) whether anything is in flight
__device__ __forceinline__ bool issue_down_copies(int tid, const route_id* ids, int num_experts,
                                                  int nrows, int r0, const u16* w2,
                                                  unsigned char* smem, u32 bar) {
    int nvalid = 0;
#pragma unroll
    for (int j = 0; j < TOPK; ++j) nvalid += valid_id((long long)ids[j], num_experts);
    const u32 slot_bytes = (u32)max(nrows, 0) * INTER * 2;
    if (tid == 0 && nvalid > 0 && slot_bytes > 0) {
        mbar_expect_tx(bar, nvalid * slot_bytes);
        for (int j = 0; j < TOPK; ++j) {
            const long long e = (long long)ids[j];
            if (!valid_id(e, num_experts)) continue;
            const char* src = (const char*)(w2 + ((size_t)e * HID + r0) * INTER);
            const u32 dst = smem_addr(smem + SM_W2 + j * SLOT_BYTES);
            for (u32 off = 0; off < slot_bytes; off += COPY_BYTES)
                bulk_g2s(dst + off, src + off, min((u32)COPY_BYTES, slot_bytes - off), bar);
        }
    }
    return nvalid > 0 && slot_bytes > 0;
}

// counters: [0] CTAs past the gate-up, [1] CTAs past the wait (the last re-arms both)
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
moe_decode_kernel(const u16* __restrict__ x, const u16* __restrict__ w13,
                  const u16* __restrict__ w2, const float* __restrict__ tw,
                  const route_id* __restrict__ ids, u16* __restrict__ act_g,
                  int* __restrict__ cnt, u16* __restrict__ out, int num_experts) {
    extern __shared__ __align__(128) unsigned char smem[];
#ifdef PDL
    // a programmatic dependent of the routing: resident early, then wait for the ids and x
    // (it never triggers its own dependents early: they launch as its CTAs exit)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int slot = blockIdx.x / PARTS, part = blockIdx.x % PARTS;
    const long long e = (long long)ids[slot];
    const bool valid = valid_id(e, num_experts);
    const int r0 = blockIdx.x * ROWS, nrows = max(0, min(ROWS, HID - r0));
    const int n0 = part * NI, ncols = min(NI, INTER - n0);
    const u32 bar = smem_addr(smem + SM_BAR);
    if (tid == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // 1. the down rows, in flight from the start (LATE_COPY, a lab variant: after the wait)
#ifndef LATE_COPY
    const bool copying = issue_down_copies(tid, ids, num_experts, nrows, r0, w2, smem, bar);
#endif
    // 2. this warp's first gate-up column pair in flight before anything waits on a barrier,
    // then x as fp32 in shared memory, then the CTA's column pairs: one pair per warp at a
    // time, the next pair's 2 x HCH loads issued before the current pair's dot products (a
    // register double buffer)
    const u16* wg = w13 + (size_t)(valid ? e : 0) * 2 * INTER * HID + lane * 8;
    uint4 cg[HCH], cu[HCH];
    int c = warp;
    if (valid && c < ncols) {
#pragma unroll
        for (int i = 0; i < HCH; ++i) {
            cg[i] = ld_stream(wg + (size_t)(n0 + c) * HID + i * 256);
            cu[i] = ld_stream(wg + (size_t)(INTER + n0 + c) * HID + i * 256);
        }
    }
    float* xs = (float*)(smem + SM_X);
    for (int i = tid; i < HID / 2; i += NTHREADS) {
        const u32 v = ((const u32*)x)[i];
        xs[2 * i] = lo16(v);
        xs[2 * i + 1] = hi16(v);
    }
    __syncthreads();
    if (valid) {
        for (; c < ncols; c += NWARPS) {
            uint4 ng[HCH], nu[HCH];
            const int cn = c + NWARPS;
            if (cn < ncols) {
#pragma unroll
                for (int i = 0; i < HCH; ++i) {
                    ng[i] = ld_stream(wg + (size_t)(n0 + cn) * HID + i * 256);
                    nu[i] = ld_stream(wg + (size_t)(INTER + n0 + cn) * HID + i * 256);
                }
            }
            float ag = 0.f, au = 0.f;
#pragma unroll
            for (int i = 0; i < HCH; ++i) {
                const float4* xa = (const float4*)(xs + i * 256 + lane * 8);
                const float4 a = xa[0], b = xa[1];
                ag = dot8(cg[i], a, b, ag);
                au = dot8(cu[i], a, b, au);
            }
            ag = warp_sum(ag);
            au = warp_sum(au);
            if (lane == 0) {
                const float h = ag / (1.f + __expf(-ag)) * au;
                act_g[slot * INTER + n0 + c] = round16(h);
            }
#pragma unroll
            for (int i = 0; i < HCH; ++i) {
                cg[i] = ng[i];
                cu[i] = nu[i];
            }
        }
    }
    // 3. count in, wait for every CTA's gate-up
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        atomicAdd(cnt, 1);
        while (ld_acquire(cnt) < GRID) {
        }
        __threadfence();
        if (atomicAdd(cnt + 1, 1) == GRID - 1) {  // the last one past the wait re-arms
            atomicExch(cnt + 1, 0);
            atomicExch(cnt, 0);
        }
    }
#ifdef LATE_COPY
    const bool copying = issue_down_copies(tid, ids, num_experts, nrows, r0, w2, smem, bar);
#endif
    __syncthreads();
    // 4. the activation rows into shared memory (past L1: other CTAs wrote them), then the
    // down rows: warp w takes slots w, w + NWARPS, ..., RG rows at a time so RG independent
    // shuffle reductions overlap
    u32* as = (u32*)(smem + SM_ACT);
    for (int i = tid; i < TOPK * INTER / 2; i += NTHREADS) as[i] = ld_cg32((const u32*)act_g + i);
    if (copying) mbar_wait(bar, 0);
    __syncthreads();
    float* ps = (float*)(smem + SM_PART);
    for (int j = warp; j < TOPK; j += NWARPS) {
        const bool vj = valid_id((long long)ids[j], num_experts);
        const float wt = vj ? tw[j] : 0.f;
        float areg[ICH * 8];
#pragma unroll
        for (int i = 0; i < ICH; ++i) {
            const uint4 a = *(const uint4*)((const u16*)as + j * INTER + i * 256 + lane * 8);
            areg[i * 8 + 0] = lo16(a.x); areg[i * 8 + 1] = hi16(a.x);
            areg[i * 8 + 2] = lo16(a.y); areg[i * 8 + 3] = hi16(a.y);
            areg[i * 8 + 4] = lo16(a.z); areg[i * 8 + 5] = hi16(a.z);
            areg[i * 8 + 6] = lo16(a.w); areg[i * 8 + 7] = hi16(a.w);
        }
        const u16* w2s = (const u16*)(smem + SM_W2 + j * SLOT_BYTES);
        for (int r = 0; r < nrows; r += RG) {
            float acc[RG];
#pragma unroll
            for (int g = 0; g < RG; ++g) {
                acc[g] = 0.f;
                if (vj && r + g < nrows) {
#pragma unroll
                    for (int i = 0; i < ICH; ++i) {
                        const uint4 w = *(const uint4*)(w2s + (r + g) * INTER + i * 256 +
                                                        lane * 8);
                        const float* a = areg + i * 8;
                        acc[g] = dot8(w, make_float4(a[0], a[1], a[2], a[3]),
                                      make_float4(a[4], a[5], a[6], a[7]), acc[g]);
                    }
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
                for (int g = 0; g < RG; ++g) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], o);
            }
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < RG; ++g)
                    if (r + g < nrows) ps[j * ROWS + r + g] = acc[g] * wt;
            }
        }
    }
    // 5. each row's TOPK partials summed in slot order
    __syncthreads();
    for (int r = tid; r < nrows; r += NTHREADS) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < TOPK; ++j) s += ps[j * ROWS + r];
        out[r0 + r] = round16(s);
    }
}
