// Paged decode attention (fp32 q / o, fp32 or bf16 caches) and the K/V row store of the CPU
// attention backend ("torch_cpu").

#include "cpu_common.h"

namespace {

#ifdef TSK_X86
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

// The same task in AVX2+FMA for D = 8 * DV (8 lanes; the softmax tail in scalar code).
template <int DV, typename CT>
__attribute__((target("avx2,fma"))) void decode_task_avx2(
    const float* qb, int64_t q_sh, int64_t group, int64_t len, float sc,
    const CT* (*row)(const void*, const CT*, int64_t), const void* ctx, const CT* kc,
    const CT* vc, float* s, float* ob, int64_t o_sh) {
  for (int64_t j = 0; j < len; ++j) {
    const CT* kj = row(ctx, kc, j);
    __m256 kv[DV];
    _Pragma("GCC unroll 16") for (int c = 0; c < DV; ++c) kv[c] = load_w8(kj + 8 * c);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qb + g * q_sh;
      __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qg), kv[0]);
      _Pragma("GCC unroll 16") for (int c = 1; c < DV; ++c) a = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * c), kv[c], a);
      s[g * len + j] = hsum256(a) * sc;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sg = s + g * len;
    float m = sg[0];
    for (int64_t j = 1; j < len; ++j) m = std::max(m, sg[j]);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + j), mv));
      _mm256_storeu_ps(sg + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    float total = hsum256(sum);
    for (; j < len; ++j) {
      sg[j] = std::exp(sg[j] - m);
      total += sg[j];
    }
    const float inv = 1.f / total;
    for (int64_t i = 0; i < len; ++i) sg[i] *= inv;
  }
  // one query head at a time: its DV accumulators stay in registers (16 ymm in all)
  for (int64_t g = 0; g < group; ++g) {
    __m256 acc[DV];
    _Pragma("GCC unroll 16") for (int c = 0; c < DV; ++c) acc[c] = _mm256_setzero_ps();
    const float* sg = s + g * len;
    for (int64_t j = 0; j < len; ++j) {
      const CT* vj = row(ctx, vc, j);
      const __m256 p = _mm256_set1_ps(sg[j]);
      _Pragma("GCC unroll 16") for (int c = 0; c < DV; ++c) acc[c] = _mm256_fmadd_ps(p, load_w8(vj + 8 * c), acc[c]);
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < DV; ++c) _mm256_storeu_ps(ob + g * o_sh + 8 * c, acc[c]);
  }
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
  const Isa isa = vector ? cpu_isa() : Isa::scalar;
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
    if ((isa == Isa::avx512 || isa == Isa::avx2) && group <= 8 && (d == 64 || d == 128)) {
      struct Ctx { const int32_t* pt; int64_t ps, hkv, d, h; };
      const Ctx ctx{pt + b * pt_sb, page_size, hkv, d, h};
      auto rowf = [](const void* c, const CT* cache, int64_t j) -> const CT* {
        const auto* x = static_cast<const Ctx*>(c);
        const int64_t pg = x->pt[j / x->ps];
        return cache + ((pg * x->ps + j % x->ps) * x->hkv + x->h) * x->d;
      };
      float* o0 = ob + h * group * o_sh;
      if (isa == Isa::avx2) {
        if (d == 64)
          decode_task_avx2<8, CT>(qb, q_sh, group, len, sc, rowf, &ctx, kc, vc, s.data(), o0,
                                  o_sh);
        else
          decode_task_avx2<16, CT>(qb, q_sh, group, len, sc, rowf, &ctx, kc, vc, s.data(), o0,
                                   o_sh);
        return;
      }
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
      int64_t j = 0;
#ifdef TSK_NEON
      if (isa == Isa::neon) {  // (the dot products and the V sums: `omp simd` loops)
        const float32x4_t mv = vdupq_n_f32(m);
        float32x4_t acc4 = vdupq_n_f32(0.f);
        for (; j + 4 <= len; j += 4) {
          const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(sg + j), mv));
          vst1q_f32(sg + j, e);
          acc4 = vaddq_f32(acc4, e);
        }
        sum = vaddvq_f32(acc4);
      }
#endif
      for (; j < len; ++j) {
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
  // Waking the thread team costs more than a small decode's whole work (a batch-1 step of the
  // default model: 3 tasks of ~60 keys, ~10 us of math, 30 calls a step), and on a loaded CPU
  // the wait for the other thread's time slice is longer still: stay on this thread there.
  int64_t work = 0;
  for (int64_t b = 0; b < batch; ++b) work += static_cast<int64_t>(lens[b]) * hq * d;
#ifdef _OPENMP
#pragma omp parallel if (tasks > 1 && work >= (int64_t{1} << 18))
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

}  // namespace

#ifndef TSK_NO_BINDINGS
void bind_attention(nb::module_& mod) {
  mod.def("decode_attn_f32", recordable(&decode_attn_f32), nb::arg("q"), nb::arg("q_sb"),
          nb::arg("q_sh"), nb::arg("k"), nb::arg("v"), nb::arg("num_pages"),
          nb::arg("page_size"),
          nb::arg("hkv"), nb::arg("d"), nb::arg("pt"), nb::arg("pt_sb"), nb::arg("pt_cols"),
          nb::arg("lens"), nb::arg("batch"), nb::arg("hq"), nb::arg("scale"), nb::arg("o"),
          nb::arg("o_sb"), nb::arg("o_sh"), nb::arg("vector") = true,
          nb::arg("bf16_cache") = false,
          "Paged decode attention, fp32 q/o, fp32 or bf16 contiguous caches [P, page, Hkv, D].");
  mod.def("store_rows", recordable(&store_rows),
          "dst[slots[t]] = src[t] for rows of `width` elements (negative slots skipped).");
}
#endif  // TSK_NO_BINDINGS
