// TEST INFRASTRUCTURE: domino_ops._simt. Importing it registers torch.ops.domino_simt.*
// (the CUDA kernels run by the SIMT emulator on CPU tensors, see bindings/simt_impls.cpp);
// the functions below run the emulator's self-test kernels.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "simt/selftest_kernels.cuh"

namespace py = pybind11;
namespace st = domino::simt_selftest;

PYBIND11_MODULE(_simt, m) {
  m.doc() = "Host SIMT emulation of domino_ops' CUDA kernels (test infrastructure only)";
  // Release the GIL: the emulator's OS threads never touch Python.
  m.def("block_sum", &st::block_sum, py::arg("x"), py::arg("blocks"), py::arg("threads"), py::arg("sync"),
        py::call_guard<py::gil_scoped_release>());
  m.def("warp_ops", &st::warp_ops, py::arg("threads"), py::call_guard<py::gil_scoped_release>());
  m.def("atomics", &st::atomics, py::arg("blocks"), py::arg("threads"), py::call_guard<py::gil_scoped_release>());
  m.def("read_unwritten_shared", &st::read_unwritten_shared, py::arg("blocks"),
        py::call_guard<py::gil_scoped_release>());
  m.def("launch_status", &st::launch_status, py::arg("blocks"), py::arg("threads"), py::arg("smem"));
}
