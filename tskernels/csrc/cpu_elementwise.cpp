// Row ops of a CPU decode step in fp32: RMSNorm (+ fused residual add), SiLU-and-mul, RoPE
// (the "cpu_native" backends of the norm, activation and rope families). SiLU-and-mul has
// AVX-512, AVX2 and NEON paths; the others are loops the compiler vectorizes.

#include "cpu_common.h"

namespace {

#ifdef TSK_X86
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

__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* g, const float* u, float* y,
                                                       int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}
#endif

#ifdef TSK_NEON
void silu_mul_neon(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  const float32x4_t one = vdupq_n_f32(1.f);
  for (; i + 4 <= n; i += 4) {
    const float32x4_t gv = vld1q_f32(g + i);
    const float32x4_t sg = vdivq_f32(gv, vaddq_f32(one, exp_neon(vnegq_f32(gv))));
    vst1q_f32(y + i, vmulq_f32(sg, vld1q_f32(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}
#endif

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
  const Isa isa = vector ? cpu_isa() : Isa::scalar;
  const auto* x = reinterpret_cast<const float*>(x_ptr);
  auto* y = reinterpret_cast<float*>(y_ptr);
  nb::gil_scoped_release nogil;
#pragma omp parallel for if (rows * inter >= kParallelElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = x + r * x_stride;
    const float* u = g + inter;
    float* yr = y + r * y_stride;
#ifdef TSK_X86
    if (isa == Isa::avx512) {
      silu_mul_avx512(g, u, yr, inter);
      continue;
    }
    if (isa == Isa::avx2) {
      silu_mul_avx2(g, u, yr, inter);
      continue;
    }
#endif
#ifdef TSK_NEON
    if (isa == Isa::neon) {
      silu_mul_neon(g, u, yr, inter);
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

#ifndef TSK_NO_BINDINGS
void bind_elementwise(nb::module_& mod) {
  mod.def("rmsnorm_f32", recordable(&rmsnorm_f32));
  mod.def("silu_and_mul_f32", recordable(&silu_and_mul_f32), nb::arg("x"), nb::arg("x_stride"),
          nb::arg("y"), nb::arg("y_stride"), nb::arg("rows"), nb::arg("inter"),
          nb::arg("vector") = true);
  mod.def("rope_f32", recordable(&rope_f32));
}
#endif  // TSK_NO_BINDINGS
