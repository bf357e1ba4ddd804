// CPU kernels of tskernels' CPU backends. Small-M fp32 GEMM for CPU decode steps: C[M, N] = A[M, K] . B[N, K]^T (B in the nn.Linear
// layout), M <= 16.
//
// Decode-shaped GEMMs are bound by streaming the weights B from DRAM. BLAS libraries treat them
// as general GEMMs (packing B, i.e. reading and writing it once more) or run a GEMV per row of A,
// and on our 2-core dev box reach 10-16 GB/s against ~32 GB/s of read bandwidth. Here every
// weight row is read exactly once and multiplied into all M rows of A (held in L1), with up to
// 16 independent accumulators, split over N across OpenMP threads (torch's team).
//
// The AVX-512 path is chosen at run time (__builtin_cpu_supports); elsewhere a portable loop
// computes the same sums (slowly). Summation order: 16 K-lanes accumulated in K order, then a
// tree reduction of the lanes — not BLAS's order, so results differ from torch.mm in the last
// bits; the tests bound the error against a float64 reference.
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TSK_X86 1
#endif

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace {

// ---- kernels -------------------------------------------------------------------------------
// Weights B are fp32 (WT = float) or bf16 (WT = uint16_t, the top half of an fp32: widened
// exactly on load); A and C are fp32.
template <typename WT>
struct Args {
  const float* a;
  const WT* b;
  float* c;
  int64_t m, n, k, lda, ldb, ldc;
};

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
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
      p.c[i * p.ldc + n] = s;
    }
  }
}

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

// MB rows of A times NB rows of B per inner iteration: MB * NB accumulators.
template <int MB, int NB, typename WT>
__attribute__((target("avx512f,fma"))) void block_avx512(const Args<WT>& p, int64_t m0,
                                                          int64_t n) {
  __m512 acc[MB][NB];
  _Pragma("GCC unroll 16") for (int i = 0; i < MB; ++i)
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const WT* w[NB];
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) w[j] = p.b + (n + j) * p.ldb;
  const float* x[MB];
  _Pragma("GCC unroll 16") for (int i = 0; i < MB; ++i) x[i] = p.a + (m0 + i) * p.lda;
  int64_t kk = 0;
  for (; kk + 16 <= p.k; kk += 16) {
    if constexpr (MB > 1) {
      // With several rows of A each weight line takes longer to consume and the hardware
      // prefetcher falls behind: fetch 16 KB ahead (measured: 12-15 -> 17-19 GB/s at M=8 on
      // the dev box; no gain at M=1). Prefetches never fault past the end of B.
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w[j] + kk) + 16384, _MM_HINT_T0);
    }
    __m512 wv[NB];
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) wv[j] = load_w(w[j] + kk);
    _Pragma("GCC unroll 16") for (int i = 0; i < MB; ++i) {
      __m512 xv = _mm512_loadu_ps(x[i] + kk);
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < p.k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (p.k - kk)) - 1u);
    __m512 wv[NB];
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) wv[j] = load_w_tail(w[j] + kk, p.k - kk);
    _Pragma("GCC unroll 16") for (int i = 0; i < MB; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, x[i] + kk);
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MB; ++i)
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j)
      p.c[(m0 + i) * p.ldc + n + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// Weight rows per block for MB rows of A: keep MB * NB <= 16 accumulators.
template <int MB>
constexpr int nb_for() {
  return MB == 1 ? 8 : MB == 2 ? 4 : MB <= 4 ? 4 : 2;
}

template <int MB, typename WT>
__attribute__((target("avx512f,fma"))) void rows_mb(const Args<WT>& p, int64_t m0, int64_t n0,
                                                    int64_t n1) {
  constexpr int NB = nb_for<MB>();
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) block_avx512<MB, NB>(p, m0, n);
  for (; n < n1; ++n) block_avx512<MB, 1>(p, m0, n);
}

template <typename WT>
void rows_avx512(const Args<WT>& p, int64_t n0, int64_t n1) {
  // A's rows in groups of <= 8 (each group streams this thread's slice of B once; with
  // M <= 16 that is at most two passes, the second from L2/L3 for the slices that fit).
  for (int64_t m0 = 0; m0 < p.m; m0 += 8) {
    switch (std::min<int64_t>(8, p.m - m0)) {
      case 1: rows_mb<1>(p, m0, n0, n1); break;
      case 2: rows_mb<2>(p, m0, n0, n1); break;
      case 3: rows_mb<3>(p, m0, n0, n1); break;
      case 4: rows_mb<4>(p, m0, n0, n1); break;
      case 5: rows_mb<5>(p, m0, n0, n1); break;
      case 6: rows_mb<6>(p, m0, n0, n1); break;
      case 7: rows_mb<7>(p, m0, n0, n1); break;
      default: rows_mb<8>(p, m0, n0, n1); break;
    }
  }
}
#endif

bool has_avx512() {
#ifdef TSK_X86
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

template <typename WT>
void gemm_impl(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
               int64_t lda, int64_t ldb, int64_t ldc, bool vector) {
  if (m < 0 || n < 0 || k < 0 || m > 16)
    throw std::invalid_argument("gemm: need 0 <= M <= 16 and N, K >= 0");
  if (lda < k || ldb < k || ldc < n) throw std::invalid_argument("gemm: bad leading dims");
  Args<WT> p{reinterpret_cast<const float*>(a), reinterpret_cast<const WT*>(b),
             reinterpret_cast<float*>(c), m, n, k, lda, ldb, ldc};
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) p.c[i * ldc + j] = 0.f;
    return;
  }
  const bool avx = vector && has_avx512();
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
#ifdef TSK_X86
    if (avx) return rows_avx512(p, n0, n1);
#endif
    rows_portable(p, n0, n1);
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
  gemm_impl<float>(a, b, c, m, n, k, lda, ldb, ldc, vector);
}

void gemm_bf16w(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
                int64_t lda, int64_t ldb, int64_t ldc, bool vector) {
  gemm_impl<uint16_t>(a, b, c, m, n, k, lda, ldb, ldc, vector);
}


#ifdef TSK_X86
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

// One (request, KV head) of decode attention for D = 16 * DV, G <= 8 query heads.
template <int DV, typename CT>
__attribute__((target("avx512f,fma"))) void decode_task_avx512(
    const float* qb, int64_t q_sh, int64_t group, int64_t len, float sc,
    const CT* (*row)(const void*, const CT*, int64_t), const void* ctx, const CT* kc,
    const CT* vc, float* s, float* ob, int64_t o_sh) {
  __m512 qv[8][DV];
  for (int64_t g = 0; g < group; ++g)
    _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) qv[g][c] = _mm512_loadu_ps(qb + g * q_sh + 16 * c);
  for (int64_t j = 0; j < len; ++j) {
    const CT* kj = row(ctx, kc, j);
    __m512 kv[DV];
    _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) kv[c] = load_w(kj + 16 * c);
    for (int64_t g = 0; g < group; ++g) {
      __m512 a = _mm512_mul_ps(qv[g][0], kv[0]);
      _Pragma("GCC unroll 8") for (int c = 1; c < DV; ++c) a = _mm512_fmadd_ps(qv[g][c], kv[c], a);
      s[g * len + j] = _mm512_reduce_add_ps(a) * sc;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sg = s + g * len;
    float m = sg[0];
    for (int64_t j = 1; j < len; ++j) m = std::max(m, sg[j]);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sg + j), mv));
      _mm512_storeu_ps(sg + j, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (j < len) {
      const __mmask16 k = static_cast<__mmask16>((1u << (len - j)) - 1u);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sg + j), mv));
      _mm512_mask_storeu_ps(sg + j, k, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    const float inv = 1.f / _mm512_reduce_add_ps(sum);
    for (int64_t i = 0; i < len; ++i) sg[i] *= inv;
  }
  __m512 acc[8][DV];
  for (int64_t g = 0; g < group; ++g)
    _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; ++j) {
    const CT* vj = row(ctx, vc, j);
    __m512 vv[DV];
    _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) vv[c] = load_w(vj + 16 * c);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(s[g * len + j]);
      _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  for (int64_t g = 0; g < group; ++g)
    _Pragma("GCC unroll 8") for (int c = 0; c < DV; ++c) _mm512_storeu_ps(ob + g * o_sh + 16 * c, acc[g][c]);
}

// y = silu(g) * u over n floats
__attribute__((target("avx512f,fma"))) void silu_mul_avx512(const float* g, const float* u,
                                                             float* y, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 sg = _mm512_div_ps(gv, _mm512_add_ps(one, e));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(sg, _mm512_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}
#endif

// ---- paged decode attention (fp32) and K/V store for the CPU backend ----------------------
// One query token per request attends to its seq_len cached keys, read through the page table
// token by token (slots a request does not own are never read, so poisoned pages are harmless).
// The G = Hq / Hkv query heads of a KV head share each key/value read. Parallel over
// (request, KV head) on torch's OpenMP team.
// Caches in fp32 (CT = float) or bf16 (CT = uint16_t, widened on load); q and o fp32.
template <typename CT>
void decode_attn_impl(uintptr_t q_ptr, int64_t q_sb, int64_t q_sh, uintptr_t k_ptr,
                      uintptr_t v_ptr, int64_t num_pages, int64_t page_size, int64_t hkv,
                      int64_t d, uintptr_t pt_ptr, int64_t pt_sb, int64_t pt_cols,
                      uintptr_t lens_ptr, int64_t batch, int64_t hq, double scale,
                      uintptr_t o_ptr, int64_t o_sb, int64_t o_sh, bool vector) {
  if (batch < 0 || hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || page_size <= 0)
    throw std::invalid_argument("decode_attn_f32: bad shape arguments");
  const auto* q = reinterpret_cast<const float*>(q_ptr);
  const auto* kc = reinterpret_cast<const CT*>(k_ptr);
  const auto* vc = reinterpret_cast<const CT*>(v_ptr);
  const auto* pt = reinterpret_cast<const int32_t*>(pt_ptr);
  const auto* lens = reinterpret_cast<const int32_t*>(lens_ptr);
  auto* o = reinterpret_cast<float*>(o_ptr);
  // Validate every page a request owns before touching memory: a clear error, never a crash.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[b];
    if (len < 0) throw std::invalid_argument("seq_lens: negative length");
    const int64_t pages = (len + page_size - 1) / page_size;
    if (pages > pt_cols)
      throw std::invalid_argument("page_table: too few columns for seq_lens[" +
                                  std::to_string(b) + "]");
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t pg = pt[b * pt_sb + i];
      if (pg < 0 || pg >= num_pages)
        throw std::invalid_argument("page_table: page id " + std::to_string(pg) +
                                    " out of range [0, " + std::to_string(num_pages) + ")");
    }
  }
  nb::gil_scoped_release nogil;
  const bool avx = vector && has_avx512();
  const int64_t group = hq / hkv, tasks = batch * hkv;
  const float sc = static_cast<float>(scale);
  auto task = [&](int64_t t, std::vector<float>& s, std::vector<float>& acc) {
    const int64_t b = t / hkv, h = t % hkv, len = lens[b];
    float* ob = o + b * o_sb;
    if (len == 0) {
      for (int64_t g = 0; g < group; ++g)
        for (int64_t x = 0; x < d; ++x) ob[(h * group + g) * o_sh + x] = 0.f;
      return;
    }
    s.resize(static_cast<size_t>(group * len));
    const float* qb = q + b * q_sb + h * group * q_sh;
    auto row = [&](const CT* cache, int64_t j) {
      const int64_t pg = pt[b * pt_sb + j / page_size];
      return cache + ((pg * page_size + j % page_size) * hkv + h) * d;
    };
#ifdef TSK_X86
    if (avx && group <= 8 && (d == 64 || d == 128)) {
      struct Ctx { const int32_t* pt; int64_t ps, hkv, d, h; };
      const Ctx ctx{pt + b * pt_sb, page_size, hkv, d, h};
      auto rowf = [](const void* c, const CT* cache, int64_t j) -> const CT* {
        const auto* x = static_cast<const Ctx*>(c);
        const int64_t pg = x->pt[j / x->ps];
        return cache + ((pg * x->ps + j % x->ps) * x->hkv + x->h) * x->d;
      };
      float* o0 = ob + h * group * o_sh;
      if (d == 64)
        decode_task_avx512<4, CT>(qb, q_sh, group, len, sc, rowf, &ctx, kc, vc, s.data(), o0,
                                  o_sh);
      else
        decode_task_avx512<8, CT>(qb, q_sh, group, len, sc, rowf, &ctx, kc, vc, s.data(), o0,
                                  o_sh);
      return;
    }
#endif
    acc.assign(static_cast<size_t>(group * d), 0.f);
    for (int64_t j = 0; j < len; ++j) {
      const CT* kj = row(kc, j);
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = qb + g * q_sh;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t x = 0; x < d; ++x) dot += qg[x] * widen(kj[x]);
        s[g * len + j] = dot * sc;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float* sg = s.data() + g * len;
      float m = sg[0];
      for (int64_t j = 1; j < len; ++j) m = std::max(m, sg[j]);
      float sum = 0.f;
      for (int64_t j = 0; j < len; ++j) {
        sg[j] = std::exp(sg[j] - m);
        sum += sg[j];
      }
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < len; ++j) sg[j] *= inv;
    }
    for (int64_t j = 0; j < len; ++j) {
      const CT* vj = row(vc, j);
      for (int64_t g = 0; g < group; ++g) {
        const float p = s[g * len + j];
        float* ag = acc.data() + g * d;
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) ag[x] += p * widen(vj[x]);
      }
    }
    for (int64_t g = 0; g < group; ++g)
      for (int64_t x = 0; x < d; ++x) ob[(h * group + g) * o_sh + x] = acc[g * d + x];
  };
#ifdef _OPENMP
#pragma omp parallel if (tasks > 1)
  {
    std::vector<float> s, acc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) task(t, s, acc);
  }
#else
  std::vector<float> s, acc;
  for (int64_t t = 0; t < tasks; ++t) task(t, s, acc);
#endif
}

void decode_attn_f32(uintptr_t q_ptr, int64_t q_sb, int64_t q_sh, uintptr_t k_ptr,
                     uintptr_t v_ptr, int64_t num_pages, int64_t page_size, int64_t hkv,
                     int64_t d, uintptr_t pt_ptr, int64_t pt_sb, int64_t pt_cols,
                     uintptr_t lens_ptr, int64_t batch, int64_t hq, double scale,
                     uintptr_t o_ptr, int64_t o_sb, int64_t o_sh, bool vector, bool bf16_cache) {
  auto f = bf16_cache ? &decode_attn_impl<uint16_t> : &decode_attn_impl<float>;
  f(q_ptr, q_sb, q_sh, k_ptr, v_ptr, num_pages, page_size, hkv, d, pt_ptr, pt_sb, pt_cols,
    lens_ptr, batch, hq, scale, o_ptr, o_sb, o_sh, vector);
}

// k_cache/v_cache rows [num_slots, width] (width = Hkv * D elements of `elem` bytes,
// contiguous); token t goes to row slots[t] (skipped when negative).
void store_rows(uintptr_t src_ptr, int64_t src_stride, uintptr_t dst_ptr, int64_t num_slots,
                int64_t width, uintptr_t slots_ptr, int64_t tokens, int64_t elem) {
  if (elem != 2 && elem != 4) throw std::invalid_argument("store_rows: 2- or 4-byte elements");
  const auto* slots = reinterpret_cast<const int64_t*>(slots_ptr);
  for (int64_t t = 0; t < tokens; ++t)
    if (slots[t] >= num_slots)
      throw std::invalid_argument("slot_mapping: slot " + std::to_string(slots[t]) +
                                  " out of range [0, " + std::to_string(num_slots) + ")");
  const auto* src = reinterpret_cast<const char*>(src_ptr);
  auto* dst = reinterpret_cast<char*>(dst_ptr);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    std::memcpy(dst + slots[t] * width * elem, src + t * src_stride * elem,
                static_cast<size_t>(width * elem));
  }
}

// ---- elementwise / row ops of a decode step (fp32) -------------------------------------------
// Plain loops the compiler vectorizes; rows split over OpenMP threads only when there is
// enough work to pay for waking the team.
constexpr int64_t kParallelElems = 1 << 15;

// y = x / sqrt(mean(x^2) + eps) * w per row; with `res`, x + res is formed first (fp32), written
// to `new_res`, and normalized.
void rmsnorm_f32(uintptr_t x_ptr, int64_t x_stride, uintptr_t res_ptr, int64_t res_stride,
                 uintptr_t w_ptr, double eps, uintptr_t y_ptr, int64_t y_stride,
                 uintptr_t new_res_ptr, int64_t rows, int64_t n) {
  const auto* x = reinterpret_cast<const float*>(x_ptr);
  const auto* res = reinterpret_cast<const float*>(res_ptr);
  const auto* w = reinterpret_cast<const float*>(w_ptr);
  auto* y = reinterpret_cast<float*>(y_ptr);
  auto* nr = reinterpret_cast<float*>(new_res_ptr);
  nb::gil_scoped_release nogil;
  auto row = [&](int64_t r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    const float* src = xr;
    if (res) {
      const float* rr = res + r * res_stride;
      float* nrr = nr + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) nrr[i] = xr[i] + rr[i];
      src = nrr;
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = src[i] * inv * w[i];
  };
#pragma omp parallel for if (rows * n >= kParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) row(r);
}

// y[r, i] = silu(x[r, i]) * x[r, I + i]
void silu_and_mul_f32(uintptr_t x_ptr, int64_t x_stride, uintptr_t y_ptr, int64_t y_stride,
                      int64_t rows, int64_t inter, bool vector) {
  const bool avx = vector && has_avx512();
  const auto* x = reinterpret_cast<const float*>(x_ptr);
  auto* y = reinterpret_cast<float*>(y_ptr);
  nb::gil_scoped_release nogil;
#pragma omp parallel for if (rows * inter >= kParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = x + r * x_stride;
    const float* u = g + inter;
    float* yr = y + r * y_stride;
#ifdef TSK_X86
    if (avx) {
      silu_mul_avx512(g, u, yr, inter);
      continue;
    }
#endif
    for (int64_t i = 0; i < inter; ++i) yr[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

// Rotary embedding of x [T, H, D] (row stride, head stride) into a contiguous out [T, H, D]:
// the first `rot` dims rotate by positions[t] with cos/sin from cache [P, width] (cos in
// [0, rot/2), sin in [width/2, width/2 + rot/2)); neox pairs (i, i + rot/2), gptj (2i, 2i+1).
void rope_f32(uintptr_t x_ptr, int64_t x_st, int64_t x_sh, uintptr_t out_ptr, int64_t tokens,
              int64_t heads, int64_t d, uintptr_t pos_ptr, bool pos64, uintptr_t cache_ptr,
              int64_t max_pos, int64_t width, int64_t rot, bool neox) {
  if (rot % 2 || rot > d || rot > width)
    throw std::invalid_argument("rope: rotary dims must be even and fit the head and cache");
  const auto* x = reinterpret_cast<const float*>(x_ptr);
  auto* out = reinterpret_cast<float*>(out_ptr);
  const auto* cache = reinterpret_cast<const float*>(cache_ptr);
  auto pos_at = [&](int64_t t) -> int64_t {
    return pos64 ? reinterpret_cast<const int64_t*>(pos_ptr)[t]
                 : reinterpret_cast<const int32_t*>(pos_ptr)[t];
  };
  for (int64_t t = 0; t < tokens; ++t)
    if (pos_at(t) < 0 || pos_at(t) >= max_pos)
      throw std::invalid_argument("positions: " + std::to_string(pos_at(t)) +
                                  " outside the cos/sin cache [0, " + std::to_string(max_pos) +
                                  ")");
  nb::gil_scoped_release nogil;
  const int64_t half = rot / 2, cs_half = width / 2;
#pragma omp parallel for if (tokens * heads * d >= kParallelElems && tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* cs = cache + pos_at(t) * width;
    const float* cosv = cs;
    const float* sinv = cs + cs_half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + t * x_st + h * x_sh;
      float* o = out + (t * heads + h) * d;
      if (neox) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = xr[i], b = xr[i + half];
          o[i] = a * cosv[i] - b * sinv[i];
          o[i + half] = b * cosv[i] + a * sinv[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float a = xr[2 * i], b = xr[2 * i + 1];
          o[2 * i] = a * cosv[i] - b * sinv[i];
          o[2 * i + 1] = b * cosv[i] + a * sinv[i];
        }
      }
      for (int64_t i = rot; i < d; ++i) o[i] = xr[i];
    }
  }
}

}  // namespace

NB_MODULE(_cpu, mod) {
  mod.doc() = "tskernels CPU kernels (small-M fp32 GEMM)";
  mod.def("gemm_f32", &gemm_f32, nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "C[M,N] = A[M,K] . B[N,K]^T on raw float32 pointers (row-major, M <= 16).");
  mod.def("openmp", [] {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
  });
  mod.def("gemm_bf16w", &gemm_bf16w, nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "As gemm_f32 with bf16 weights B (widened exactly); A and C float32.");
  mod.def("has_avx512", &has_avx512);
  mod.def("decode_attn_f32", &decode_attn_f32, nb::arg("q"), nb::arg("q_sb"), nb::arg("q_sh"),
          nb::arg("k"), nb::arg("v"), nb::arg("num_pages"), nb::arg("page_size"),
          nb::arg("hkv"), nb::arg("d"), nb::arg("pt"), nb::arg("pt_sb"), nb::arg("pt_cols"),
          nb::arg("lens"), nb::arg("batch"), nb::arg("hq"), nb::arg("scale"), nb::arg("o"),
          nb::arg("o_sb"), nb::arg("o_sh"), nb::arg("vector") = true,
          nb::arg("bf16_cache") = false,
          "Paged decode attention, fp32 q/o, fp32 or bf16 contiguous caches [P, page, Hkv, D].");
  mod.def("rmsnorm_f32", &rmsnorm_f32);
  mod.def("silu_and_mul_f32", &silu_and_mul_f32, nb::arg("x"), nb::arg("x_stride"),
          nb::arg("y"), nb::arg("y_stride"), nb::arg("rows"), nb::arg("inter"),
          nb::arg("vector") = true);
  mod.def("rope_f32", &rope_f32);
  mod.def("store_rows", &store_rows,
          "dst[slots[t]] = src[t] for rows of `width` elements (negative slots skipped).");
}
