// The Python module domino_ops._C. Importing it registers the ops (static initialisers in
// torch_library.cpp); the functions here only describe the build.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace domino::cpu {
const char* small_batch_linear_isa();  // small_batch_linear.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "domino_ops native extension: registers torch.ops.domino_ops.*";
  m.attr("torch_version") = DOMINO_TORCH_VERSION;
#ifdef DOMINO_WITH_CUDA
  m.attr("cuda_compiled") = true;
#else
  m.attr("cuda_compiled") = false;
#endif
  m.def("small_batch_linear_isa", &domino::cpu::small_batch_linear_isa,
        "The instruction-set path (avx512, avx2, generic) small_batch_linear takes now");
}
