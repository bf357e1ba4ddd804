// The tskernels._cpu extension: the CPU kernels of each family (see cpu_common.h).

#include "cpu_common.h"

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
  bind_gemm(mod);
  bind_attention(mod);
  bind_elementwise(mod);
}
