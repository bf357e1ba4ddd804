// Arch-neutral helpers of the hand-written CUDA kernels (any sm_80+ target): the short integer
// types, -inf, generic -> shared address conversion and the quad (4-lane) reductions of the
// mma.sync / wgmma accumulator layouts. The fp8 decode (sm_89+) includes this directly, the
// Hopper kernels through hopper_common.cuh. Everything is inlined: the kernels' code is what it
// was when each kernel had its own copy.
#pragma once

#define NEG_INF __int_as_float(0xff800000u)

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
