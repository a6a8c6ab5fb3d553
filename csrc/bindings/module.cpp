// The Python module domino_ops._C. Importing it registers the ops (static initialisers in
// torch_library.cpp and at the end of each csrc/cpu/<op>.cpp); the functions here describe the build and choose the instruction-set
// build of the CPU kernels (python/domino_ops/cpu.py wraps them).
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "cpu/isa_select.h"
#include "cpu/kernel_switches.h"

namespace py = pybind11;

namespace {
// c10::ValueError (a bad DOMINO_CPU_ISA or build name) as a Python ValueError with the
// bare message.
template <typename F>
auto value_errors(F f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw py::value_error(e.msg());
  }
}
}  // namespace
namespace domino::cpu {
const char* small_batch_linear_isa();  // small_batch_linear.cpp
bool small_batch_linear_packed_supported();  // small_batch_linear_packed.cpp
bool small_batch_linear_packed_f32_supported();  // small_batch_linear_packed.cpp
const char* small_batch_linear_packed_path();  // small_batch_linear_packed.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "domino_ops native extension: registers torch.ops.domino_ops.*";
  // The environment variables the kernels read once (DOMINO_CPU_ISA, the kernel switches),
  // read now, with the GIL held: at a kernel's first call, the GIL released, they would
  // race another thread's os.environ write (glibc's getenv against setenv). A bad
  // DOMINO_CPU_ISA is kept, and raised by every CPU op, as before.
  domino::cpu::read_kernel_switches();
  try {
    (void)domino::cpu::active_isa();
  } catch (const c10::Error&) {
  }
  m.attr("torch_version") = DOMINO_TORCH_VERSION;
#ifdef DOMINO_WITH_CUDA
  m.attr("cuda_compiled") = true;
#else
  m.attr("cuda_compiled") = false;
#endif
  m.def("cpu_isa", [] { return value_errors([] { return domino::cpu::active_isa(); }); },
        "Instruction-set build the CPU kernels run (DOMINO_CPU_ISA, else the widest supported)");
  m.def("cpu_isas_compiled", &domino::cpu::compiled_isas, "CPU kernel builds in this extension, widest first");
  m.def("cpu_isas_supported", &domino::cpu::supported_isas, "CPU kernel builds this CPU runs, widest first");
  m.def("cpu_model", &domino::cpu::cpu_model, "The CPU's brand string, family and model");
  m.def("_force_cpu_isa",
        [](const std::string& name) { value_errors([&] { domino::cpu::force_isa(name); return 0; }); },
        "Tests and benchmarks: run the CPU kernels as build `name` ('' to restore)");
  m.def("_kernel_switch",
        [](const std::string& name) -> std::optional<std::string> {
          const char* v = value_errors([&] { return domino::cpu::kernel_switch(domino::cpu::kernel_switch_named(name)); });
          return v == nullptr ? std::nullopt : std::optional<std::string>(v);
        },
        "A CPU kernel switch's value now (None: unset), by its environment variable's name");
  m.def("_kernel_switch_names", &domino::cpu::kernel_switch_names,
        "The CPU kernel switches' environment variables' names");
  m.def("_set_kernel_switch",
        [](const std::string& name, const std::optional<std::string>& value) {
          value_errors([&] {
            domino::cpu::set_kernel_switch(domino::cpu::kernel_switch_named(name),
                                           value.has_value() ? value->c_str() : nullptr);
            return 0;
          });
        },
        "Tests and benchmarks: set a CPU kernel switch (None: unset) for the calls after this one");
  m.def("small_batch_linear_isa",
        [] { return value_errors([] { return std::string(domino::cpu::small_batch_linear_isa()); }); },
        "The instruction-set path (avx512, avx2, generic) small_batch_linear takes now");
  m.def("small_batch_linear_packed_supported", &domino::cpu::small_batch_linear_packed_supported,
        "Whether this CPU runs small_batch_linear_packed on bf16 panels (AVX2 and FMA, or AVX512-BF16, -BW and -VL)");
  m.def("small_batch_linear_packed_f32_supported", &domino::cpu::small_batch_linear_packed_f32_supported,
        "Whether this CPU runs small_batch_linear_packed on float32 panels (AVX2 and FMA, or AVX-512F, -BW and -VL)");
  m.def("small_batch_linear_packed_path",
        [] { return value_errors([] { return std::string(domino::cpu::small_batch_linear_packed_path()); }); },
        "The product small_batch_linear_packed runs now on bf16 panels: amx, avx512_bf16 or avx2");
}
