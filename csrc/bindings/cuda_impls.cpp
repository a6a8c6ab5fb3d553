// CUDA implementations registered with the dispatcher: thin adapters from tensors to the
// plain-CUDA launchers in csrc/cuda/, on torch's current stream.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda/verify_greedy.cuh"
#include "ops.h"

namespace domino::cuda {

void verify_greedy_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                        at::Tensor out_tokens, at::Tensor num_accepted) {
  check_verify_greedy_args(draft_tokens, target_logits, out_tokens, num_accepted);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const cudaError_t err = launch_verify_greedy(
      draft_tokens.data_ptr<int64_t>(), target_logits.data_ptr(),
      target_logits.scalar_type() == at::kBFloat16, draft_tokens.size(0), draft_tokens.size(1),
      target_logits.size(2), out_tokens.data_ptr<int64_t>(), num_accepted.data_ptr<int64_t>(),
      c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "verify_greedy CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace domino::cuda

TORCH_LIBRARY_IMPL(domino_ops, CUDA, m) {
  m.impl("verify_greedy", &domino::cuda::verify_greedy_cuda);
}
