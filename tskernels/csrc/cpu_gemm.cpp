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

#include "cpu_common.h"

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

}  // namespace

void bind_gemm(nb::module_& mod) {
  mod.def("gemm_f32", &gemm_f32, nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "C[M,N] = A[M,K] . B[N,K]^T on raw float32 pointers (row-major, M <= 16).");
  mod.def("gemm_bf16w", &gemm_bf16w, nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("m"),
          nb::arg("n"), nb::arg("k"), nb::arg("lda"), nb::arg("ldb"), nb::arg("ldc"),
          nb::arg("vector") = true,
          "As gemm_f32 with bf16 weights B (widened exactly); A and C float32.");
}
