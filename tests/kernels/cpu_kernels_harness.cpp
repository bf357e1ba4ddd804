// A stand-alone run of the C++ CPU kernels (tskernels/csrc/*.cpp, included whole so that their
// internal entry points are reachable): every SIMD path this build has (NEON on AArch64;
// AVX-512 / AVX2 on x86) against the same kernel's portable loop: the decode-row GEMM for fp32,
// bf16, int8 and 4-bit weights with float and int8 activations (M = 1..16, odd N, several K),
// SiLU-and-mul, and paged decode attention (fp32 / bf16 caches, head dims 64 / 128, GQA groups,
// permuted pages, empty rows).
// Built and run by tests/kernels/test_cpu_isa.py: natively, and for aarch64 with the cross
// compiler under qemu-aarch64 (user-mode emulation: the NEON code runs, its speed means nothing).
// Exit status 0 and "cpu_kernels_harness: ... OK" when every path agrees.
#define TSK_NO_BINDINGS  // no Python: cpu_common.h's lock release is a no-op, no bindings
#include "../../tskernels/csrc/cpu_attention.cpp"
#include "../../tskernels/csrc/cpu_elementwise.cpp"
#include "../../tskernels/csrc/cpu_gemm.cpp"

#include <cstdio>
#include <random>

namespace {

std::mt19937 rng(1234);

float uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

uint16_t bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

struct Case {
  const char* what;
  int64_t m, n, k;
};

int failures = 0, cases = 0;
double worst = 0.0;

// |fast - portable| within tol * (1 + sum_k |a| |w|) per element (summation order differs
// between paths of the float kernels; the integer-dot kernels agree far closer)
void compare(const Case& c, const std::vector<float>& fast, const std::vector<float>& slow,
             const std::vector<double>& mag, double tol) {
  ++cases;
  for (int64_t i = 0; i < c.m * c.n; ++i) {
    const double err = std::fabs(double(fast[i]) - double(slow[i])) / (1.0 + mag[i]);
    worst = std::max(worst, err);
    if (!(err <= tol)) {
      std::printf("MISMATCH %s m=%lld n=%lld k=%lld at %lld: %.9g vs %.9g\n", c.what,
                  (long long)c.m, (long long)c.n, (long long)c.k, (long long)i, fast[i],
                  slow[i]);
      ++failures;
      return;
    }
  }
}

void run(int64_t m, int64_t n, int64_t k) {
  std::vector<float> a(m * k);
  for (auto& x : a) x = uni(-2.f, 2.f);
  std::vector<float> wf(n * k), sc(n), q4s(n * (k / 32)), q4m(n * (k / 32));
  std::vector<uint16_t> wb(n * k);
  std::vector<int8_t> w8(n * k);
  std::vector<uint8_t> w4(n * k / 2);
  for (int64_t i = 0; i < n * k; ++i) {
    wf[i] = uni(-1.f, 1.f);
    wb[i] = bf16(wf[i]);
    w8[i] = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
  }
  for (auto& x : w4) x = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 255)(rng));
  for (auto& x : sc) x = uni(0.001f, 0.02f);
  for (auto& x : q4s) x = uni(0.01f, 0.1f);
  for (auto& x : q4m) x = uni(-0.8f, 0.f);
  std::vector<double> mag(m * n, 0.0);  // sum_k |a| * (largest |w| of any kind: 1)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < k; ++t) mag[i * n + j] += std::fabs(a[i * k + t]);
  auto A = reinterpret_cast<uintptr_t>(a.data());
  std::vector<float> fast(m * n), slow(m * n);
  auto C = [](std::vector<float>& v) { return reinterpret_cast<uintptr_t>(v.data()); };
  auto P = [](const auto& v) { return reinterpret_cast<uintptr_t>(v.data()); };
  const double tol = 2e-6;
  for (bool v : {true, false}) gemm_f32(A, P(wf), C(v ? fast : slow), m, n, k, k, k, n, v);
  compare({"f32", m, n, k}, fast, slow, mag, tol);
  for (bool v : {true, false}) gemm_bf16w(A, P(wb), C(v ? fast : slow), m, n, k, k, k, n, v);
  compare({"bf16w", m, n, k}, fast, slow, mag, tol);
  std::vector<double> mag8(mag);  // int8 weights: |q| <= 127 times the row scale (<= 0.02)
  for (auto& x : mag8) x *= 127 * 0.02;
  for (bool act : {false, true}) {
    for (bool v : {true, false})
      gemm_i8w(A, P(w8), P(sc), C(v ? fast : slow), m, n, k, k, k, n, v, act);
    compare({act ? "i8w act_int8" : "i8w", m, n, k}, fast, slow, mag8, tol);
  }
  if (k % 32) return;
  std::vector<double> mag4(mag);  // 4-bit: |d q + m| <= 0.1 * 15 + 0.8
  for (auto& x : mag4) x *= 2.3;
  for (bool act : {false, true}) {
    for (bool v : {true, false})
      gemm_q4w(A, P(w4), P(q4s), P(q4m), C(v ? fast : slow), m, n, k, k, k / 2, n, v, act);
    compare({act ? "q4w act_int8" : "q4w", m, n, k}, fast, slow, mag4, tol);
  }
}

void run_silu(int64_t rows, int64_t inter) {
  std::vector<float> x(rows * 2 * inter), fast(rows * inter), slow(rows * inter);
  for (auto& v : x) v = uni(-12.f, 12.f);
  auto X = reinterpret_cast<uintptr_t>(x.data());
  silu_and_mul_f32(X, 2 * inter, reinterpret_cast<uintptr_t>(fast.data()), inter, rows, inter,
                   true);
  silu_and_mul_f32(X, 2 * inter, reinterpret_cast<uintptr_t>(slow.data()), inter, rows, inter,
                   false);
  std::vector<double> mag(rows * inter);
  for (int64_t i = 0; i < rows * inter; ++i) mag[i] = std::fabs(slow[i]);
  // polynomial exp (~2e-7 relative) against libm's
  compare({"silu_and_mul", rows, inter, 0}, fast, slow, mag, 1e-6);
}

template <typename CT>
void run_attention(int64_t batch, int64_t hq, int64_t hkv, int64_t d, bool bf16_cache) {
  const int64_t page = 4, pages = 64, cols = 16;
  std::vector<CT> kc(pages * page * hkv * d), vc(kc.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    const float k = uni(-1.f, 1.f), v = uni(-1.f, 1.f);
    if constexpr (sizeof(CT) == 2) {
      kc[i] = bf16(k);
      vc[i] = bf16(v);
    } else {
      kc[i] = k;
      vc[i] = v;
    }
  }
  std::vector<int32_t> table(batch * cols), lens(batch);
  std::vector<int32_t> perm(pages - 1);
  for (int64_t i = 0; i < pages - 1; ++i) perm[i] = static_cast<int32_t>(i + 1);
  for (int64_t b = 0; b < batch; ++b) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t c = 0; c < cols; ++c) table[b * cols + c] = perm[c];
    lens[b] = b == 1 ? 0 : std::uniform_int_distribution<int>(1, cols * page)(rng);
  }
  std::vector<float> q(batch * hq * d), fast(batch * hq * d), slow(batch * hq * d);
  for (auto& v : q) v = uni(-2.f, 2.f);
  auto P = [](const auto& v) { return reinterpret_cast<uintptr_t>(v.data()); };
  for (bool v : {true, false})
    decode_attn_f32(P(q), hq * d, d, P(kc), P(vc), pages, page, hkv, d, P(table), cols, cols,
                    P(lens), batch, hq, 1.0 / std::sqrt(double(d)), P(v ? fast : slow), hq * d,
                    d, v, bf16_cache);
  std::vector<double> mag(batch * hq * d, 1.0);  // outputs are averages of |v| <= 1
  compare({bf16_cache ? "decode_attn bf16" : "decode_attn f32", batch, hq, d}, fast, slow, mag,
          2e-6);
}

}  // namespace

int main() {
  for (int64_t rows : {1, 3, 8})
    for (int64_t inter : {1, 7, 64, 1536}) run_silu(rows, inter);
  for (int64_t d : {64, 128})
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{9, 3}, {8, 8}, {16, 2}, {32, 4}}) {
      run_attention<float>(3, hq, hkv, d, false);
      run_attention<uint16_t>(3, hq, hkv, d, true);
    }
  for (int64_t m : {1, 2, 3, 5, 8, 9, 16})
    for (int64_t n : {1, 7, 33, 130})
      for (int64_t k : {32, 64, 96, 576}) run(m, n, k);
  run(1, 1536, 576);  // a model shape, N split over the threads
  run(4, 576, 1536);
  std::printf("cpu_kernels_harness: isa=%s cases=%d worst=%.3g %s\n", isa_name(cpu_isa()), cases,
              worst, failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
