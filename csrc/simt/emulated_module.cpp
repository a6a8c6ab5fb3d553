// TEST INFRASTRUCTURE: the Python module domino_simt, built by `make simt` (CMake option
// DOMINO_SIMT) into build/simt/ and never installed. Importing it registers
// torch.ops.domino_simt.<op>: the CUDA kernels of csrc/cuda/ compiled as host C++
// (emulated_kernels.cpp) and run by the SIMT emulator on CPU tensors, with the same
// schemas and the same tensor adapters (bindings/kernel_adapters.h) as the real CUDA ops.
// Not a performance path (one fiber per CUDA thread). The functions below run the emulator's
// self-test kernels.
//
// pybind11 and ATen come first: the kernel headers bring in simt.h's macros.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/kernel_adapters.h"
#include "bindings/schemas.h"
#include "simt/selftest_kernels.cuh"

namespace {

struct EmulatedDevice {
  struct Guard {
    explicit Guard(c10::Device) {}
  };
  static cudaStream_t stream() { return nullptr; }
};

}  // namespace

TORCH_LIBRARY(domino_simt, m) { domino::schemas::define_ops(m); }

TORCH_LIBRARY_IMPL(domino_simt, CPU, m) { domino::cuda::impl_ops<EmulatedDevice>(m); }

namespace py = pybind11;
namespace st = domino::simt_selftest;

PYBIND11_MODULE(domino_simt, m) {
  m.doc() = "Host SIMT emulation of domino_ops' CUDA kernels (test infrastructure only)";
  // Release the GIL: the emulated threads never touch Python.
  m.def("block_sum", &st::block_sum, py::arg("x"), py::arg("blocks"), py::arg("threads"), py::arg("sync"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rotate", &st::rotate, py::arg("x"), py::arg("blocks"), py::arg("offset"), py::arg("sync"),
        py::call_guard<py::gil_scoped_release>());
  m.def("warp_ops", &st::warp_ops, py::arg("threads"), py::call_guard<py::gil_scoped_release>());
  m.def("atomics", &st::atomics, py::arg("blocks"), py::arg("threads"), py::call_guard<py::gil_scoped_release>());
  m.def("read_unwritten_shared", &st::read_unwritten_shared, py::arg("blocks"),
        py::call_guard<py::gil_scoped_release>());
  m.def("divergent_barriers", &st::divergent_barriers, py::call_guard<py::gil_scoped_release>());
  m.def("launch_status", &st::launch_status, py::arg("blocks"), py::arg("threads"), py::arg("smem"));
}
