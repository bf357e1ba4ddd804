// A stand-alone run of the decode-row GEMM kernels (tskernels/csrc/cpu_gemm.cpp, included whole
// so that its internal entry points are reachable): every SIMD path this build has (NEON on
// AArch64; AVX-512 / AVX2 on x86) against the same kernel's portable loop, for fp32, bf16, int8
// and 4-bit weights, with float and int8 activations, over M = 1..16, odd N and several K.
// Built and run by tests/kernels/test_cpu_isa.py: natively, and for aarch64 with the cross
// compiler under qemu-aarch64 (user-mode emulation: the NEON code runs, its speed means nothing).
// Exit status 0 and "cpu_gemm_harness: OK" when every path agrees.
#define TSK_NO_BINDINGS  // no Python: cpu_common.h's lock release is a no-op, no bindings
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

}  // namespace

int main() {
  for (int64_t m : {1, 2, 3, 5, 8, 9, 16})
    for (int64_t n : {1, 7, 33, 130})
      for (int64_t k : {32, 64, 96, 576}) run(m, n, k);
  run(1, 1536, 576);  // a model shape, N split over the threads
  run(4, 576, 1536);
  std::printf("cpu_gemm_harness: isa=%s cases=%d worst=%.3g %s\n", isa_name(cpu_isa()), cases,
              worst, failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
