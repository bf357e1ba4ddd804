// The tskernels._cpu extension: the CPU kernels of each family (see cpu_common.h).

#include "cpu_common.h"

#include <nanobind/stl/string.h>

NB_MODULE(_cpu, mod) {
  mod.doc() = "tskernels CPU kernels (small-M GEMM, paged decode attention, row ops)";
  mod.def("openmp", [] {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
  });
  mod.def("has_avx512", &has_avx512);
  mod.def("isa", [] { return std::string(isa_name(cpu_isa())); },
          "SIMD level the kernels use now: the CPU's best, capped by TSKERNELS_CPU_ISA.");
  mod.def("detected_isa", [] { return std::string(isa_name(detected_isa())); },
          "The CPU's best SIMD level the kernels have a path for (no cap).");
  bind_gemm(mod);
  bind_attention(mod);
  bind_elementwise(mod);
}
