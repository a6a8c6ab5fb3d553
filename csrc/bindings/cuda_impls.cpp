// CUDA implementations registered with the dispatcher: the adapters of kernel_adapters.h
// under a CUDAGuard for the tensors' device, launched on torch's current stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "bindings/kernel_adapters.h"

namespace {

struct CudaDevice {
  using Guard = c10::cuda::CUDAGuard;
  static cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(domino_ops, CUDA, m) { domino::cuda::impl_ops<CudaDevice>(m); }
