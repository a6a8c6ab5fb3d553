// TEST INFRASTRUCTURE: the CUDA kernels of csrc/cuda/, compiled as host C++ and run by the
// SIMT emulator (csrc/simt/), registered as torch.ops.domino_simt.<op> for CPU tensors
// with the same schemas and the same tensor adapters as the real CUDA ops. Slow by
// design (one OS thread per CUDA thread); never used outside the tests.
#include <torch/library.h>

#include "bindings/kernel_adapters.h"
#include "bindings/schemas.h"

namespace domino::cuda {
namespace {

void domino_head_rollout_simt(at::Tensor base_logits, const at::Tensor& hproj, const at::Tensor& state,
                              const at::Tensor& gru_input, const std::optional<at::Tensor>& w_ih,
                              const at::Tensor& w_hh, const at::Tensor& w1s, const at::Tensor& w2,
                              double temperature, int64_t top_k, double top_p,
                              const std::optional<at::Tensor>& uniforms, bool write_logits,
                              at::Tensor tokens, at::Tensor logprobs, at::Tensor state_out) {
  run_domino_head_rollout(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k,
                          top_p, uniforms, write_logits, tokens, logprobs, state_out, nullptr);
}

void sample_simt(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                 const std::optional<at::Tensor>& uniforms, at::Tensor tokens) {
  run_sample(logits, temperature, top_k, top_p, uniforms, tokens, nullptr);
}

void verify_greedy_simt(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                        at::Tensor out_tokens, at::Tensor num_accepted) {
  run_verify_greedy(draft_tokens, target_logits, out_tokens, num_accepted, nullptr);
}

void verify_sampling_simt(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                          const at::Tensor& target_probs, const at::Tensor& uniforms_accept,
                          const at::Tensor& uniforms_resample, at::Tensor out_tokens,
                          at::Tensor num_accepted) {
  run_verify_sampling(draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample,
                      out_tokens, num_accepted, nullptr);
}

}  // namespace
}  // namespace domino::cuda

TORCH_LIBRARY(domino_simt, m) {
  m.def(domino::schemas::kDominoHeadRollout);
  m.def(domino::schemas::kSample);
  m.def(domino::schemas::kVerifyGreedy);
  m.def(domino::schemas::kVerifySampling);
}

TORCH_LIBRARY_IMPL(domino_simt, CPU, m) {
  m.impl("domino_head_rollout", &domino::cuda::domino_head_rollout_simt);
  m.impl("sample", &domino::cuda::sample_simt);
  m.impl("verify_greedy", &domino::cuda::verify_greedy_simt);
  m.impl("verify_sampling", &domino::cuda::verify_sampling_simt);
}
