// CUDA implementations registered with the dispatcher: the adapters of kernel_adapters.h
// on torch's current stream and device.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "bindings/kernel_adapters.h"

namespace domino::cuda {
namespace {

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void domino_head_rollout_cuda(at::Tensor base_logits, const at::Tensor& hproj, const at::Tensor& state,
                              const at::Tensor& gru_input, const std::optional<at::Tensor>& w_ih,
                              const at::Tensor& w_hh, const at::Tensor& w1s, const at::Tensor& w2,
                              double temperature, int64_t top_k, double top_p,
                              const std::optional<at::Tensor>& uniforms, bool write_logits,
                              at::Tensor tokens, at::Tensor logprobs, at::Tensor state_out) {
  const c10::cuda::CUDAGuard guard(base_logits.device());
  run_domino_head_rollout(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k,
                          top_p, uniforms, write_logits, tokens, logprobs, state_out, current_stream());
}

void sample_cuda(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                 const std::optional<at::Tensor>& uniforms, at::Tensor tokens) {
  const c10::cuda::CUDAGuard guard(logits.device());
  run_sample(logits, temperature, top_k, top_p, uniforms, tokens, current_stream());
}

void verify_greedy_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                        at::Tensor out_tokens, at::Tensor num_accepted) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  run_verify_greedy(draft_tokens, target_logits, out_tokens, num_accepted, current_stream());
}

void verify_sampling_cuda(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                          const at::Tensor& target_probs, const at::Tensor& uniforms_accept,
                          const at::Tensor& uniforms_resample, at::Tensor out_tokens,
                          at::Tensor num_accepted) {
  const c10::cuda::CUDAGuard guard(target_probs.device());
  run_verify_sampling(draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample,
                      out_tokens, num_accepted, current_stream());
}

}  // namespace
}  // namespace domino::cuda

TORCH_LIBRARY_IMPL(domino_ops, CUDA, m) {
  m.impl("domino_head_rollout", &domino::cuda::domino_head_rollout_cuda);
  m.impl("sample", &domino::cuda::sample_cuda);
  m.impl("verify_greedy", &domino::cuda::verify_greedy_cuda);
  m.impl("verify_sampling", &domino::cuda::verify_sampling_cuda);
}
