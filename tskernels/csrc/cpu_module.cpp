// The tskernels._cpu extension: the CPU kernels of each family (see cpu_common.h).

#include "cpu_common.h"

#include <nanobind/stl/string.h>

#include <limits>
#include <memory>

CpuProgram*& capturing_program() {
  thread_local CpuProgram* p = nullptr;
  return p;
}

namespace {

// tskernels.cpu_graph's C++ half: begin / end a capture on this thread, replay a program.
void bind_capture(nb::module_& mod) {
  nb::class_<CpuProgram>(mod, "Program", "Kernel calls recorded by a capture, in order.")
      .def("__len__", [](const CpuProgram& p) { return p.calls.size(); })
      .def(
          "replay",
          [](const CpuProgram& p, size_t begin, size_t end) {
            end = std::min(end, p.calls.size());
            for (size_t i = begin; i < end; ++i) p.calls[i]();
          },
          nb::arg("begin") = 0, nb::arg("end") = std::numeric_limits<size_t>::max(),
          "Run calls [begin, end) again, in order, with the arguments they were recorded with.");
  mod.def("capture_begin", [] {
    if (capturing_program() != nullptr)
      throw std::runtime_error("capture_begin: this thread is already capturing");
    capturing_program() = new CpuProgram;
  });
  mod.def("capture_size", [] {
    if (capturing_program() == nullptr)
      throw std::runtime_error("capture_size: this thread is not capturing");
    return capturing_program()->calls.size();
  }, "Calls recorded so far by this thread's capture.");
  mod.def("capture_end", [] {
    std::unique_ptr<CpuProgram> p(capturing_program());
    if (!p) throw std::runtime_error("capture_end: this thread is not capturing");
    capturing_program() = nullptr;
    return p.release();
  }, nb::rv_policy::take_ownership, "Stop this thread's capture; its program.");
  mod.def("capture_abort", [] {
    delete capturing_program();
    capturing_program() = nullptr;
  }, "Stop this thread's capture (if any) and drop what it recorded.");
}

}  // namespace

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
  bind_capture(mod);
}
