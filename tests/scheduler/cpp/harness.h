// A tiny test harness: TEST(name) registers a function, CHECK(cond) records a failure and
// continues, REQUIRE(cond) stops the test. main() runs every test and returns 1 on failure.
#pragma once

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace harness {

struct Case {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}
inline int& failures() {
  static int n = 0;
  return n;
}
struct Register {
  Register(const char* name, std::function<void()> fn) { cases().push_back({name, std::move(fn)}); }
};
struct Stop {};

}  // namespace harness

#define TEST(name)                                                   \
  static void test_##name();                                         \
  static harness::Register register_##name(#name, test_##name);      \
  static void test_##name()

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++harness::failures();                                                    \
    }                                                                           \
  } while (0)

#define REQUIRE(cond)                                                             \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      ++harness::failures();                                                      \
      throw harness::Stop{};                                                      \
    }                                                                             \
  } while (0)

// CHECK_THROWS(expr, Type, "substring"): expr throws Type whose what() contains substring.
#define CHECK_THROWS(expr, Type, substring)                                             \
  do {                                                                                  \
    bool thrown_ = false;                                                               \
    try {                                                                               \
      expr;                                                                             \
    } catch (const Type& e_) {                                                          \
      thrown_ = std::string(e_.what()).find(substring) != std::string::npos;            \
      if (!thrown_) std::fprintf(stderr, "  message was: %s\n", e_.what());             \
    }                                                                                   \
    if (!thrown_) {                                                                     \
      std::fprintf(stderr, "%s:%d: expected %s(\"%s\") from %s\n", __FILE__, __LINE__, \
                   #Type, substring, #expr);                                            \
      ++harness::failures();                                                            \
    }                                                                                   \
  } while (0)

#define HARNESS_MAIN                                                                  \
  int main() {                                                                        \
    for (auto& c : harness::cases()) {                                                \
      int before = harness::failures();                                               \
      try {                                                                           \
        c.fn();                                                                       \
      } catch (const harness::Stop&) {                                                \
      } catch (const std::exception& e) {                                             \
        std::fprintf(stderr, "%s: unexpected exception: %s\n", c.name, e.what());     \
        ++harness::failures();                                                        \
      }                                                                               \
      std::printf("[%s] %s\n", harness::failures() == before ? "ok" : "FAIL", c.name); \
    }                                                                                 \
    std::printf("%zu tests, %d failed checks\n", harness::cases().size(), harness::failures()); \
    return harness::failures() == 0 ? 0 : 1;                                          \
  }
