// One TORCH_LIBRARY schema per op and the CPU implementations. Outputs are passed in
// (mutated, `!` in the schema) so that a caller can reuse buffers and capture a decode
// loop in a CUDA graph; the Python wrappers in domino_ops allocate them for you. Fake
// implementations for torch.compile live in python/domino_ops/_fake.py.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(domino_ops, m) {
  m.def(
      "domino_head_rollout(Tensor(a!) base_logits, Tensor hproj, Tensor state, Tensor gru_input, "
      "Tensor? w_ih, Tensor w_hh, Tensor w1s, Tensor w2, float temperature, int top_k, "
      "float top_p, Tensor? uniforms, bool write_logits, Tensor(b!) tokens, "
      "Tensor(c!) logprobs, Tensor(d!) state_out) -> ()");
  m.def(
      "sample(Tensor logits, float temperature, int top_k, float top_p, Tensor? uniforms, "
      "Tensor(a!) tokens) -> ()");
  m.def(
      "verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor(a!) out_tokens, "
      "Tensor(b!) num_accepted) -> ()");
  m.def(
      "verify_sampling(Tensor draft_tokens, Tensor draft_probs, Tensor target_probs, "
      "Tensor uniforms_accept, Tensor uniforms_resample, Tensor(a!) out_tokens, "
      "Tensor(b!) num_accepted) -> ()");
}

TORCH_LIBRARY_IMPL(domino_ops, CPU, m) {
  m.impl("domino_head_rollout", &domino::cpu::domino_head_rollout_cpu);
  m.impl("sample", &domino::cpu::sample_cpu);
  m.impl("verify_greedy", &domino::cpu::verify_greedy_cpu);
  m.impl("verify_sampling", &domino::cpu::verify_sampling_cpu);
}
