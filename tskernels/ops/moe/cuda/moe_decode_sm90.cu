// One-token fused experts for Hopper (sm_90a): gate-up, SiLU-mul, down and the weighted
// combine of the TOPK routed experts of one token in one launch, with each CTA's down-weight
// slice copied into shared memory by the TMA engine while the CTA streams its gate-up rows.
//
// Why: at T = 1 the two-launch Triton path (triton_direct.py) pays two ramps and tails: the
// down's 25 MB (Qwen3-30B-A3B) can only start streaming once the gate-up's 50 MB has produced
// the activations. The down weights do not depend on the activations, only on the routing, so
// here they are in flight from the first microsecond; what is left after the gate-up is a
// shared-memory dot product per row and the combine.
//
// Grid: TOPK x PARTS CTAs, one per SM (the shared-memory footprint allows one), blockIdx =
// slot * PARTS + part. CTA (slot j, part p), expert e = ids[j]:
//   1. thread 0 issues cp.async.bulk copies of w2[e] rows [p*R, p*R + R) (contiguous, R x I
//      16-bit values) into shared memory, completing on one mbarrier;
//   2. the CTA stages x as fp32 in shared memory and computes its intermediate columns
//      n in [p*NI, p*NI + NI): act[j, n] = silu(x . w13[e, n]) * (x . w13[e, I + n]), rounded to
//      the 16-bit type (as the Triton paths round it), each warp one column pair at a time
//      with the next pair's 2 x H / 256 16-byte loads per lane in flight;
//   3. it counts itself into the slot's counter (release) and waits until all PARTS CTAs of
//      the slot have (acquire): the slot's whole activation row is then in global memory;
//   4. it waits for its down slice, reads act[j, :] (L2), and writes the weighted fp32
//      partial tw[j] * (act[j] . w2[e, r]) of each of its R rows;
//   5. the last of the TOPK CTAs of part p to arrive (an arrival counter) sums the TOPK
//      partials of those rows in slot order (deterministic) and writes out.
// The spin in step 3 needs the slot's PARTS CTAs resident together: the grid is at most the
// SM count and one CTA fits an SM, and no other kernel this one waits for runs after it
// (this kernel never triggers a programmatic dependent early). Every counter is returned to
// zero by its last user inside the launch, so graph replays start from zeros.
// Ids outside [0, E) contribute nothing (their CTAs copy and stream nothing, write zero
// partials and still count in).
//
// Compile-time: HID (H), INTER (I), TOPK, PARTS, HALF (fp16 instead of bf16), IDS64 (int64
// ids), PDL (launched as a programmatic dependent: griddepcontrol.wait first). H % 256 == 0 and I % 256 == 0 (lanes x 8 values).
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
#define ROWS ((HID + PARTS - 1) / PARTS)     // down rows per CTA
#define NI ((INTER + PARTS - 1) / PARTS)     // intermediate column pairs per CTA
#define HCH (HID / 256)                      // 8-value chunks of x per lane
#define ICH (INTER / 256)                    // 8-value chunks of an act row per lane
#define COPY_BYTES 32768                     // one bulk copy's size (a multiple of 16)

static_assert(HID % 256 == 0 && INTER % 256 == 0, "H and I must be multiples of 256");
static_assert((long long)ROWS * INTER * 2 < (1 << 20), "down slice exceeds the mbarrier's tx count");

#ifdef IDS64
typedef long long route_id;
#else
typedef int route_id;
#endif

// shared-memory layout (bytes): the down slice, x (fp32), act (fp32), the mbarrier, a flag
#define SM_W2 0
#define SM_X (SM_W2 + ROWS * INTER * 2)
#define SM_ACT (SM_X + HID * 4)
#define SM_BAR (SM_ACT + INTER * 4)
#define SM_FLAG (SM_BAR + 8)
#define SMEM_BYTES (SM_FLAG + 8)

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
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u16 ld_cg16(const u16* p) {
    u16 v;
    asm volatile("ld.global.cg.b16 %0, [%1];\n" : "=h"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// thread 0: w2[e] rows [r0, r0 + nrows) into shared memory, completing on the mbarrier
__device__ __forceinline__ void issue_down_copy(int tid, bool valid, int nrows, long long e,
                                                int r0, const u16* w2, unsigned char* smem,
                                                u32 bar) {
    if (tid == 0 && valid && nrows > 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        const u32 bytes = (u32)nrows * INTER * 2;
        mbar_expect_tx(bar, bytes);
        const char* src = (const char*)(w2 + ((size_t)e * HID + r0) * INTER);
        const u32 dst = smem_addr(smem + SM_W2);
        for (u32 off = 0; off < bytes; off += COPY_BYTES)
            bulk_g2s(dst + off, src + off, min((u32)COPY_BYTES, bytes - off), bar);
    }
}

// counters: [0, TOPK) gate-up done per slot, [TOPK, 2 TOPK) CTAs past the wait per slot,
// [2 TOPK, 2 TOPK + PARTS) slots done per part
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
moe_decode_kernel(const u16* __restrict__ x, const u16* __restrict__ w13,
                  const u16* __restrict__ w2, const float* __restrict__ tw,
                  const route_id* __restrict__ ids, u16* __restrict__ act_g,
                  float* __restrict__ part_g, int* __restrict__ cnt, u16* __restrict__ out,
                  int num_experts) {
    extern __shared__ __align__(128) unsigned char smem[];
#ifdef PDL
    // a programmatic dependent of the routing: resident early, then wait for the ids and x
    // (it never triggers its own dependents early: they launch as its CTAs exit)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int slot = blockIdx.x / PARTS, part = blockIdx.x % PARTS;
    const long long e = (long long)ids[slot];
    const bool valid = e >= 0 && e < num_experts;
    const int r0 = part * ROWS, nrows = min(ROWS, HID - r0);
    const int n0 = part * NI, ncols = min(NI, INTER - n0);
    const u32 bar = smem_addr(smem + SM_BAR);
    int* flag = (int*)(smem + SM_FLAG);

    // 1. the down slice, in flight from the start (LATE_COPY, a lab variant: after the wait)
#ifndef LATE_COPY
    issue_down_copy(tid, valid, nrows, e, r0, w2, smem, bar);
#endif
    // 2. x as fp32, then this CTA's gate-up column pairs
    float* xs = (float*)(smem + SM_X);
    for (int i = tid; i < HID / 2; i += NTHREADS) {
        const u32 v = ((const u32*)x)[i];
        xs[2 * i] = lo16(v);
        xs[2 * i + 1] = hi16(v);
    }
    __syncthreads();
    if (valid) {
        // one column pair per warp at a time, the next pair's 2 x HCH loads issued before
        // the current pair's dot products (a register double buffer)
        const u16* wg = w13 + (size_t)e * 2 * INTER * HID + lane * 8;
        uint4 cg[HCH], cu[HCH];
        int c = warp;
        if (c < ncols) {
#pragma unroll
            for (int i = 0; i < HCH; ++i) {
                cg[i] = ld_stream(wg + (size_t)(n0 + c) * HID + i * 256);
                cu[i] = ld_stream(wg + (size_t)(INTER + n0 + c) * HID + i * 256);
            }
        }
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
    // 3. count in, wait for the slot's other parts
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        atomicAdd(cnt + slot, 1);
        while (ld_acquire(cnt + slot) < PARTS) {
        }
        __threadfence();
        if (atomicAdd(cnt + TOPK + slot, 1) == PARTS - 1) {  // the slot's last reader re-arms
            atomicExch(cnt + TOPK + slot, 0);
            atomicExch(cnt + slot, 0);
        }
    }
#ifdef LATE_COPY
    issue_down_copy(tid, valid, nrows, e, r0, w2, smem, bar);
#endif
    __syncthreads();
    // 4. the down rows from shared memory
    float* as = (float*)(smem + SM_ACT);
    for (int i = tid; i < INTER; i += NTHREADS)
        as[i] = valid ? f16(ld_cg16(act_g + slot * INTER + i)) : 0.f;
    if (valid && nrows > 0) mbar_wait(bar, 0);
    __syncthreads();
    const float wt = valid ? tw[slot] : 0.f;
    float areg[ICH * 8];
#pragma unroll
    for (int i = 0; i < ICH; ++i) {
        const float4* aa = (const float4*)(as + i * 256 + lane * 8);
        const float4 a = aa[0], b = aa[1];
        areg[i * 8 + 0] = a.x; areg[i * 8 + 1] = a.y; areg[i * 8 + 2] = a.z;
        areg[i * 8 + 3] = a.w; areg[i * 8 + 4] = b.x; areg[i * 8 + 5] = b.y;
        areg[i * 8 + 6] = b.z; areg[i * 8 + 7] = b.w;
    }
    const u16* w2s = (const u16*)(smem + SM_W2);
    for (int r = warp; r < nrows; r += NWARPS) {
        float acc = 0.f;
        if (valid) {
#pragma unroll
            for (int i = 0; i < ICH; ++i) {
                const uint4 w = *(const uint4*)(w2s + r * INTER + i * 256 + lane * 8);
                const float* a = areg + i * 8;
                acc = dot8(w, make_float4(a[0], a[1], a[2], a[3]),
                           make_float4(a[4], a[5], a[6], a[7]), acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) part_g[slot * HID + r0 + r] = acc * wt;
    }
    // 5. the last slot of this part sums the TOPK partials in slot order
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        const int done = atomicAdd(cnt + 2 * TOPK + part, 1);
        *flag = done == TOPK - 1;
        if (done == TOPK - 1) {
            atomicExch(cnt + 2 * TOPK + part, 0);
            __threadfence();
        }
    }
    __syncthreads();
    if (*flag) {
        for (int r = tid; r < nrows; r += NTHREADS) {
            float s = 0.f;
#pragma unroll
            for (int j = 0; j < TOPK; ++j) s += ld_cg(part_g + j * HID + r0 + r);
            out[r0 + r] = round16(s);
        }
    }
}
