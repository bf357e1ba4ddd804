// CPU kernels of tskernels' CPU backends. Small-M GEMM for CPU decode steps:
// C[M, N] = A[M, K] . B[N, K]^T (B in the nn.Linear layout), M <= 16, A and C fp32, B fp32,
// bf16 (widened exactly on load) or int8 with one fp32 scale per row of B (weight-only
// quantization: C[i, n] = scale[n] * sum_k A[i, k] * B[n, k]).
//
// Decode-shaped GEMMs are bound by streaming the weights B from DRAM. BLAS libraries treat them
// as general GEMMs (packing B, i.e. reading and writing it once more) or run a GEMV per row of A,
// and on our 2-core dev box reach 10-16 GB/s against ~32 GB/s of read bandwidth. Here every
// weight row is read exactly once and multiplied into all M rows of A (held in L1), with up to
// 16 independent accumulators, split over N across OpenMP threads (torch's team).
//
// One kernel body (cpu_gemm_kernel.inc) is instantiated per SIMD level: AVX-512 (16 lanes),
// AVX2+FMA (8 lanes) and NEON (8 lanes as two 4-lane registers); the level is chosen per call
// (cpu_isa(): what the CPU has, capped by TSKERNELS_CPU_ISA). A portable loop computes the same
// sums elsewhere (slowly; the registry does not select this backend where it would run).
// Summation order: W K-lanes accumulated in K order, then a reduction of the lanes and the K
// tail — not BLAS's order, so results differ from torch.mm in the last bits; the tests bound
// the error against a float64 reference.

#include "cpu_common.h"

#include <type_traits>

namespace {

inline float widen(int8_t x) { return static_cast<float>(x); }

// ---- kernels -------------------------------------------------------------------------------
template <typename WT>
struct Args {
  const float* a;
  const WT* b;
  const float* scale;  // [N] per-row scales of int8 weights, nullptr otherwise
  float* c;
  int64_t m, n, k, lda, ldb, ldc;
};

// 4-bit weights: b [N, ldb bytes] with K / 2 packed bytes per row, scale / mins [N, K / 32].
struct Q4Args {
  const float* a;
  const uint8_t* b;
  const float* scale;
  const float* mins;
  float* c;
  int64_t m, n, k, lda, ldb, ldc, groups;
};

void rows_portable(const Q4Args& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.a + i * p.lda;
      float s = 0;
      for (int64_t g = 0; g < p.groups; ++g) {
        const uint8_t* w = p.b + n * p.ldb + 16 * g;
        const float d = p.scale[n * p.groups + g], o = p.mins[n * p.groups + g];
        for (int j = 0; j < 16; ++j) {
          s += x[32 * g + j] * (d * static_cast<float>(w[j] & 15) + o);
          s += x[32 * g + 16 + j] * (d * static_cast<float>(w[j] >> 4) + o);
        }
      }
      p.c[i * p.ldc + n] = s;
    }
}

template <typename WT>
void rows_portable(const Args<WT>& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const WT* w = p.b + n * p.ldb;
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.a + i * p.lda;
      float lanes[16] = {0};
      for (int64_t kk = 0; kk < p.k; ++kk) lanes[kk % 16] += x[kk] * widen(w[kk]);
      float s = 0;
      for (float v : lanes) s += v;
      p.c[i * p.ldc + n] = p.scale != nullptr ? s * p.scale[n] : s;
    }
  }
}

// Weight rows per block for MB rows of A, sized to the register file: MB * NB accumulators +
// NB weight vectors + one A vector fit in 32 (AVX-512) / 16 (AVX2, NEON pairs) registers.
// One weight row at a time at M = 1: blocks of 8 rows read 8 lines 1-3 KB apart per step,
// which this machine's prefetchers follow badly from DRAM (int8 weights, 2 threads: 139 -> 69
// us for 3072 x 576, 1.8 -> 0.8 ms for the 49152 x 576 logits; fp32 ~5 % faster)
#ifndef TSK_NB1
#define TSK_NB1 1
#endif
constexpr int nb_wide(int mb) { return mb == 1 ? TSK_NB1 : mb == 2 ? 4 : mb <= 4 ? 4 : 2; }
constexpr int nb_narrow(int mb) { return mb == 1 ? TSK_NB1 : mb == 2 ? 4 : mb <= 4 ? 3 : mb <= 6 ? 2 : 1; }
// 4-bit weights: NB groups held widened (NB * 32 / W registers) next to MB * NB accumulators
constexpr int nb4_wide(int mb) { return mb == 1 ? 8 : mb <= 4 ? 4 : 2; }
constexpr int nb4_narrow(int mb) { return mb == 1 ? 3 : mb == 2 ? 2 : 1; }
#ifndef TSK_AVX2_MG
#define TSK_AVX2_MG 6
#endif

#ifdef TSK_X86
#define TSK_TGT __attribute__((target("avx512f,fma")))
struct SimdAvx512 {
  using V = __m512;
  static constexpr int W = 16, MG = 8;
  static constexpr int nb(int mb) { return nb_wide(mb); }
  static constexpr int nb4(int mb) { return nb4_wide(mb); }
  TSK_TGT static V zero() { return _mm512_setzero_ps(); }
  TSK_TGT static V lx(const float* p) { return _mm512_loadu_ps(p); }
  TSK_TGT static V lw(const float* p) { return _mm512_loadu_ps(p); }
  TSK_TGT static V lw(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  }
  TSK_TGT static V lw(const int8_t* p) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
  }
  TSK_TGT static void lq4(const uint8_t* p, float d, float m, V* out) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    out[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(e, _mm512_set1_epi32(15))), dv,
                             mv);
    out[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(e, 4)), dv, mv);
  }
  TSK_TGT static V fma(V x, V w, V acc) { return _mm512_fmadd_ps(x, w, acc); }
  TSK_TGT static float hsum(V v) { return _mm512_reduce_add_ps(v); }
};
namespace k_avx512 {
using S = SimdAvx512;
#include "cpu_gemm_kernel.inc"
}  // namespace k_avx512
#undef TSK_TGT

#define TSK_TGT __attribute__((target("avx2,fma")))
struct SimdAvx2 {
  using V = __m256;
  static constexpr int W = 8, MG = TSK_AVX2_MG;
  static constexpr int nb(int mb) { return nb_narrow(mb); }
  static constexpr int nb4(int mb) { return nb4_narrow(mb); }
  TSK_TGT static V zero() { return _mm256_setzero_ps(); }
  TSK_TGT static V lx(const float* p) { return _mm256_loadu_ps(p); }
  TSK_TGT static V lw(const float* p) { return _mm256_loadu_ps(p); }
  TSK_TGT static V lw(const uint16_t* p) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
  TSK_TGT static V lw(const int8_t* p) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
  }
  TSK_TGT static void lq4(const uint8_t* p, float d, float m, V* out) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i e0 = _mm256_cvtepu8_epi32(v), e1 = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
    const __m256i f = _mm256_set1_epi32(15);
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(e0, f)), dv, mv);
    out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(e1, f)), dv, mv);
    out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(e0, 4)), dv, mv);
    out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(e1, 4)), dv, mv);
  }
  TSK_TGT static V fma(V x, V w, V acc) { return _mm256_fmadd_ps(x, w, acc); }
  TSK_TGT static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
namespace k_avx2 {
using S = SimdAvx2;
#include "cpu_gemm_kernel.inc"
}  // namespace k_avx2
#undef TSK_TGT
#endif  // TSK_X86

#ifdef TSK_NEON
#define TSK_TGT
// 8 lanes as two 4-lane registers (one int8 / bf16 load widens to 8 values).
struct SimdNeon {
  struct V {
    float32x4_t lo, hi;
  };
  static constexpr int W = 8, MG = TSK_AVX2_MG;
  static constexpr int nb(int mb) { return nb_narrow(mb); }
  static constexpr int nb4(int mb) { return nb4_narrow(mb); }
  static V zero() { return {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; }
  static V lx(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
  static V lw(const float* p) { return lx(p); }
  static V lw(const uint16_t* p) {
    const uint16x8_t v = vld1q_u16(p);
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)),
            vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16))};
  }
  static V lw(const int8_t* p) {
    const int16x8_t v = vmovl_s8(vld1_s8(p));
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))),
            vcvtq_f32_s32(vmovl_s16(vget_high_s16(v)))};
  }
  static V q8(uint8x8_t b, float32x4_t dv, float32x4_t mv) {
    const uint16x8_t h = vmovl_u8(b);
    return {vfmaq_f32(mv, vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), dv),
            vfmaq_f32(mv, vcvtq_f32_u32(vmovl_u16(vget_high_u16(h))), dv)};
  }
  static void lq4(const uint8_t* p, float d, float m, V* out) {
    const uint8x16_t v = vld1q_u8(p);
    const uint8x16_t lo = vandq_u8(v, vdupq_n_u8(15)), hi = vshrq_n_u8(v, 4);
    const float32x4_t dv = vdupq_n_f32(d), mv = vdupq_n_f32(m);
    out[0] = q8(vget_low_u8(lo), dv, mv);
    out[1] = q8(vget_high_u8(lo), dv, mv);
    out[2] = q8(vget_low_u8(hi), dv, mv);
    out[3] = q8(vget_high_u8(hi), dv, mv);
  }
  static V fma(V x, V w, V acc) {
    return {vfmaq_f32(acc.lo, x.lo, w.lo), vfmaq_f32(acc.hi, x.hi, w.hi)};
  }
  static float hsum(V v) { return vaddvq_f32(vaddq_f32(v.lo, v.hi)); }
};
namespace k_neon {
using S = SimdNeon;
#include "cpu_gemm_kernel.inc"
}  // namespace k_neon
#undef TSK_TGT
#endif  // TSK_NEON

template <typename P>
void run_split(const P& p, Isa isa);

#include "cpu_gemm_q4a8.inc"
#include "cpu_gemm_q4a8_vnni.inc"
#include "cpu_gemm_q4a8_x2.inc"
#include "cpu_gemm_i8a8.inc"
#include "cpu_gemm_a8_neon.inc"

// Nothing to multiply: M or N is 0, or K is 0 (then C is zero). True when C is done.
// (P: Args<WT> or Q4Args.)
template <typename P>
static bool empty_product(const P& p) {
  if (p.m == 0 || p.n == 0) return true;
  if (p.k != 0) return false;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) p.c[i * p.ldc + j] = 0.f;
  return true;
}

template <typename WT>
void gemm_impl(uintptr_t a, uintptr_t b, uintptr_t scale, uintptr_t c, int64_t m, int64_t n,
               int64_t k, int64_t lda, int64_t ldb, int64_t ldc, bool vector) {
  if (m < 0 || n < 0 || k < 0 || m > 16)
    throw std::invalid_argument("gemm: need 0 <= M <= 16 and N, K >= 0");
  if (lda < k || ldb < k || ldc < n) throw std::invalid_argument("gemm: bad leading dims");
  Args<WT> p{reinterpret_cast<const float*>(a), reinterpret_cast<const WT*>(b),
             reinterpret_cast<const float*>(scale), reinterpret_cast<float*>(c),
             m, n, k, lda, ldb, ldc};
  if (empty_product(p)) return;
  run_split(p, vector ? cpu_isa() : Isa::scalar);
}

// Rows of B split over threads, each slice run by the ISA's kernel (P: Args<WT> or Q4Args).
template <typename P>
void run_split(const P& p, Isa isa) {
  const int64_t n = p.n, k = p.k;
  nb::gil_scoped_release nogil;
  // Split N in 64-row-aligned slices over OpenMP threads: the same runtime and thread team as
  // torch's intra-op pool (torch loads libgomp first), so the two never oversubscribe the
  // cores; torch.set_num_threads() sets both. Tiny problems stay on the calling thread.
  int threads = 1;
#ifdef _OPENMP
  if (n * k >= (1 << 16)) threads = omp_get_max_threads();
#endif
  auto slice = [&](int tid) {
    const int64_t per = ((n + threads - 1) / threads + 63) / 64 * 64;
    const int64_t n0 = std::min<int64_t>(n, per * tid), n1 = std::min<int64_t>(n, n0 + per);
    if (n0 >= n1) return;
    switch (isa) {
#ifdef TSK_X86
      case Isa::avx512: return k_avx512::rows(p, n0, n1);
      case Isa::avx2: return k_avx2::rows(p, n0, n1);
#endif
#ifdef TSK_NEON
      case Isa::neon: return k_neon::rows(p, n0, n1);
#endif
      default: return rows_portable(p, n0, n1);
    }
  };
  if (threads == 1) {
    slice(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) slice(t);
#endif
}

void gemm_f32(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
              int64_t lda, int64_t ldb, int64_t ldc, bool vector) {
  gemm_impl<float>(a, b, 0, c, m, n, k, lda, ldb, ldc, vector);
}

void gemm_bf16w(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
                int64_t lda, int64_t ldb, int64_t ldc, bool vector) {
  gemm_impl<uint16_t>(a, b, 0, c, m, n, k, lda, ldb, ldc, vector);
}

// N split in slices over the OpenMP team (as run_split), body(n0, n1) per slice
#ifndef TSK_SLICES
#define TSK_SLICES 4
#endif
template <typename F>
void split_rows(int64_t n, int64_t k, const F& body) {
  nb::gil_scoped_release nogil;
  int threads = 1;
#ifdef _OPENMP
  if (n * k >= (1 << 16)) threads = omp_get_max_threads();
#endif
  // 16-row-aligned slices (a 64-byte line of C per slice edge; 64-row ones split the model's
  // N = 576 as 320 + 256 rows), TSK_SLICES per thread handed out dynamically: on a loaded
  // machine a thread that loses its core for a time slice no longer holds up half the GEMM
  // (measured: the 49152-row logits GEMM took one 8 ms scheduler quantum instead of ~2 ms
  // while another process ran)
  const int64_t parts = threads == 1 ? 1 : std::min<int64_t>(threads * TSK_SLICES, (n + 15) / 16);
  const int64_t per = ((n + parts - 1) / parts + 15) / 16 * 16;
  auto slice = [&](int64_t t) {
    const int64_t n0 = std::min<int64_t>(n, per * t), n1 = std::min<int64_t>(n, n0 + per);
    if (n0 < n1) body(n0, n1);
  };
  if (parts == 1) return slice(0);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t t = 0; t < parts; ++t) slice(t);
#endif
}

// act_int8: A quantized per group of 32 (K a multiple of 32) and integer dot products
// (cpu_gemm_i8a8.inc: AVX-512 VNNI, AVX2, portable)
void gemm_i8w(uintptr_t a, uintptr_t b, uintptr_t scale, uintptr_t c, int64_t m, int64_t n,
              int64_t k, int64_t lda, int64_t ldb, int64_t ldc, bool vector, bool act_int8) {
  if (scale == 0) throw std::invalid_argument("gemm_i8w: scale must not be null");
  if (!act_int8) return gemm_impl<int8_t>(a, b, scale, c, m, n, k, lda, ldb, ldc, vector);
  if (m < 0 || n < 0 || k < 0 || m > 16)
    throw std::invalid_argument("gemm_i8w: need 0 <= M <= 16 and N, K >= 0");
  if (k % 32) throw std::invalid_argument("gemm_i8w: act_int8 needs K a multiple of 32");
  if (lda < k || ldb < k || ldc < n) throw std::invalid_argument("gemm_i8w: bad leading dims");
  const Q4Args p{reinterpret_cast<const float*>(a), reinterpret_cast<const uint8_t*>(b),
                 reinterpret_cast<const float*>(scale), nullptr, reinterpret_cast<float*>(c),
                 m, n, k, lda, ldb, ldc, k / 32};
  if (empty_product(p)) return;
  const Isa isa = vector ? cpu_isa() : Isa::scalar;
  int path = 0;
#ifdef TSK_X86
  if (isa == Isa::avx512 && has_avx512_vnni()) path = 2;
  else if (isa == Isa::avx2 || isa == Isa::avx512) path = 1;
#endif
  const Q4A8Buf buf = quantize_rows(p);
  const Q4A8 qa = buf.view();
#ifdef TSK_NEON
  if (isa == Isa::neon)
    return split_rows(n, k, [&](int64_t n0, int64_t n1) { i8a8_rows_neon(p, qa, n0, n1); });
#endif
  const I8A8V v = path == 2 ? prepare_i8a8(p, qa) : I8A8V{};
  split_rows(n, k, [&](int64_t n0, int64_t n1) { i8a8_rows(p, qa, v, path, n0, n1); });
}

// C[M, N] = A[M, K] . W^T with 4-bit weights: b [N, ldb] bytes (K / 2 used per row),
// scale / mins float32 [N, K / 32] contiguous; K a multiple of 32.
// act_int8: A quantized per group of 32 to int8 and integer dot products (cpu_gemm_q4a8.inc);
// SIMD paths: AVX-512 VNNI where the CPU has it, else AVX2 (also AVX-512 without VNNI);
// NEON on AArch64 (cpu_gemm_a8_neon.inc); a scalar loop elsewhere.
void gemm_q4w(uintptr_t a, uintptr_t b, uintptr_t scale, uintptr_t mins, uintptr_t c, int64_t m,
              int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, bool vector,
              bool act_int8) {
  if (m < 0 || n < 0 || k < 0 || m > 16)
    throw std::invalid_argument("gemm_q4w: need 0 <= M <= 16 and N, K >= 0");
  if (k % 32) throw std::invalid_argument("gemm_q4w: K must be a multiple of 32");
  if (lda < k || ldb < k / 2 || ldc < n) throw std::invalid_argument("gemm_q4w: bad leading dims");
  if (scale == 0 || mins == 0) throw std::invalid_argument("gemm_q4w: null scale or mins");
  const Q4Args p{reinterpret_cast<const float*>(a), reinterpret_cast<const uint8_t*>(b),
                 reinterpret_cast<const float*>(scale), reinterpret_cast<const float*>(mins),
                 reinterpret_cast<float*>(c), m, n, k, lda, ldb, ldc, k / 32};
  if (empty_product(p)) return;
  const Isa isa = vector ? cpu_isa() : Isa::scalar;
  if (!act_int8) return run_split(p, isa);
  const Q4A8Buf buf = quantize_rows(p);
  const Q4A8 qa = buf.view();
#ifdef TSK_X86
  const bool vnni = isa == Isa::avx512 && has_avx512_vnni();
  const bool x2 = !vnni && (isa == Isa::avx2 || isa == Isa::avx512);
  const Q4A8V qv = vnni ? reorder_vnni(p, qa) : x2 ? reorder_groups(p, qa, 2) : Q4A8V{};
#endif
  split_rows(n, k, [&](int64_t n0, int64_t n1) {
#ifdef TSK_X86
    if (vnni) return q4a8_rows_vnni(p, qa, qv, n0, n1);
    if (x2) return q4a8_rows_x2(p, qa, qv, n0, n1);
#endif
#ifdef TSK_NEON
    if (isa == Isa::neon) return q4a8_rows_neon(p, qa, n0, n1);
#endif
    q4a8_rows_portable(p, qa, n0, n1);
  });
}

}  // namespace

#ifndef TSK_NO_BINDINGS
void bind_gemm(nb::module_& mod) {
  mod.def("gemm_q4w", recordable(&gemm_q4w),
          nb::arg("a"), nb::arg("b"), nb::arg("scale"), nb::arg("mins"),
          nb::arg("c"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("lda"),
          nb::arg("ldb"), nb::arg("ldc"), nb::arg("vector") = true, nb::arg("act_int8") = false,
          "C[M,N] = A[M,K] . W^T, W 4-bit in groups of 32 along K (w = scale * q + min); "
          "act_int8: A quantized per group of 32 to int8, integer dot products.");
  mod.def("gemm_f32", recordable(&gemm_f32),
          nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "C[M,N] = A[M,K] . B[N,K]^T on raw float32 pointers (row-major, M <= 16).");
  mod.def("gemm_bf16w", recordable(&gemm_bf16w),
          nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "As gemm_f32 with bf16 weights B (widened exactly); A and C float32.");
  mod.def("gemm_i8w", recordable(&gemm_i8w),
          nb::arg("a"), nb::arg("b"), nb::arg("scale"), nb::arg("c"),
          nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"),
          nb::arg("ldc"), nb::arg("vector") = true, nb::arg("act_int8") = false,
          "C[M,N] = scale[N] * (A[M,K] . B[N,K]^T) with int8 weights B and float32 scales; "
          "act_int8: A quantized per group of 32 to int8, integer dot products.");
}
#endif  // TSK_NO_BINDINGS
