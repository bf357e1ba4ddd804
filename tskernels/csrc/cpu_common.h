// Shared pieces of tskernels' CPU kernels (tskernels/_cpu): includes, the bf16 widening, the
// AVX-512 exp, and the run-time SIMD level (cpu_isa). One translation unit per family includes it:
// cpu_gemm.cpp (small-M GEMM), cpu_attention.cpp (paged decode attention, K/V row store),
// cpu_elementwise.cpp (RMSNorm, SiLU-and-mul, RoPE); cpu_module.cpp binds them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TSK_X86 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define TSK_NEON 1
#endif

#ifdef TSK_NO_BINDINGS
// a stand-alone build of the kernels without Python (tests/kernels/cpu_gemm_harness.cpp): no
// interpreter lock to release
namespace nanobind {
struct gil_scoped_release {};
}  // namespace nanobind
#else
#include <nanobind/nanobind.h>
#endif

namespace nb = nanobind;

// A recorded sequence of kernel calls (tskernels.cpu_graph.CPUGraph). While the calling thread
// captures, every kernel bound through `recordable` runs and then appends itself, with its
// scalar arguments (raw pointers, sizes, flags), to the program; `replay` calls them again in
// order on the same memory. Per thread: another thread's kernel calls are never recorded.
struct CpuProgram {
  std::vector<std::function<void()>> calls;
};
CpuProgram*& capturing_program();  // defined in cpu_module.cpp (one per process)

// The binding of a kernel entry (void, scalar arguments only: what it reads and writes is
// named by raw pointers) that a capture records. A call that throws is not recorded.
template <typename... A>
auto recordable(void (*fn)(A...)) {
  return [fn](A... args) {
    fn(args...);
    if (CpuProgram* p = capturing_program()) p->calls.emplace_back([fn, args...] { fn(args...); });
  };
}

namespace {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// SIMD level of the CPU kernels, chosen at run time: the best the CPU has, capped by the
// environment variable TSKERNELS_CPU_ISA ("avx512", "avx2", "neon", "scalar"; unset or
// unknown: no cap) so that the AVX2 or portable path can be measured and tested on a bigger
// CPU. Read on every call (a getenv is ~100 ns; a kernel call is >= microseconds), so a test
// can change it between calls. tskernels/platform.py applies the same cap to the features the
// registry matches kernels against.
enum class Isa : int { scalar = 0, neon = 1, avx2 = 2, avx512 = 3 };

inline Isa detected_isa() {
#ifdef TSK_X86
  static const Isa best = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
                              ? Isa::avx512
                          : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
                              ? Isa::avx2
                              : Isa::scalar;
  return best;
#elif defined(TSK_NEON)
  return Isa::neon;  // Advanced SIMD is part of the AArch64 baseline
#else
  return Isa::scalar;
#endif
}

inline Isa isa_cap() {
  const char* v = std::getenv("TSKERNELS_CPU_ISA");
  if (v == nullptr || *v == 0) return Isa::avx512;
  const std::string s(v);
  if (s == "scalar" || s == "none" || s == "portable") return Isa::scalar;
  if (s == "neon") return Isa::neon;
  if (s == "avx2") return Isa::avx2;
  return Isa::avx512;
}

inline Isa cpu_isa() {
  const Isa best = detected_isa(), cap = isa_cap();
  if (cap == Isa::scalar) return Isa::scalar;
  // neon and the x86 levels are different families: a cap of the other family does not apply
  if ((best == Isa::neon) != (cap == Isa::neon)) return best;
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

inline const char* isa_name(Isa i) {
  switch (i) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::neon: return "neon";
    default: return "scalar";
  }
}

inline bool has_avx512() { return cpu_isa() == Isa::avx512; }
inline bool has_avx2() { return cpu_isa() == Isa::avx2; }  // AVX2+FMA, no AVX-512

#ifdef TSK_X86
// 16 weights widened to fp32 (a full vector, or the first `count` of them, zeros after).
__attribute__((target("avx512f"))) inline __m512 load_w(const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"))) inline __m512 load_w(const uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
__attribute__((target("avx512f"))) inline __m512 load_w_tail(const float* p, int64_t count) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), p);
}
__attribute__((target("avx512f"))) inline __m512 load_w_tail(const uint16_t* p,
                                                             int64_t count) {
  uint16_t buf[16] = {0};
  std::memcpy(buf, p, sizeof(uint16_t) * count);
  return load_w(buf);
}

// exp(x) for a vector: 2^(x log2 e) = 2^n * 2^f, n = round, |f| <= 1/2, 2^f by a degree-6
// polynomial (rel. error ~2e-7, below fp32 rounding of the inputs), 2^n by scalef. Inputs
// below -87 flush to 0 (softmax weights that small do not matter in fp32).
__attribute__((target("avx512f,fma"))) inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// exp(x) for 8 lanes, AVX2+FMA: the same range clamp and polynomial as exp512; 2^n is built in
// the exponent field (the clamp keeps n in [-126, 127], a normal exponent).
__attribute__((target("avx2,fma"))) inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                       _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// 8 weights widened to fp32 (AVX2).
__attribute__((target("avx2"))) inline __m256 load_w8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2"))) inline __m256 load_w8(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

__attribute__((target("avx2"))) inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#ifdef TSK_NEON
// exp(x) for 4 lanes (AArch64 Advanced SIMD): exp256's clamp, polynomial and exponent build.
inline float32x4_t exp_neon(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.f));
  x = vminq_f32(x, vdupq_n_f32(88.f));
  const float32x4_t t = vmulq_f32(x, vdupq_n_f32(1.4426950408889634f));
  const float32x4_t n = vrndnq_f32(t);  // to nearest, ties to even
  const float32x4_t f = vsubq_f32(t, n);
  float32x4_t p = vdupq_n_f32(1.5403530393381606e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(9.6181291076284772e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(5.5504108664821580e-2f), p, f);
  p = vfmaq_f32(vdupq_n_f32(2.4022650695910071e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(6.9314718055994531e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
#endif

}  // namespace

#ifndef TSK_NO_BINDINGS
// Each family's translation unit adds its functions to the module.
void bind_gemm(nb::module_& mod);
void bind_attention(nb::module_& mod);
void bind_elementwise(nb::module_& mod);
#endif
