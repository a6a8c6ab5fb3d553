// The schema of every op, once: registered as domino_ops (torch_library.cpp) and, for the
// emulated CUDA kernels used by the tests, as domino_simt (simt_impls.cpp). Outputs are
// passed in (mutated, `!`) so that a caller can reuse buffers and capture a decode loop
// in a CUDA graph.
#pragma once

namespace domino::schemas {

inline constexpr const char* kDominoHeadRollout =
    "domino_head_rollout(Tensor(a!) base_logits, Tensor hproj, Tensor state, Tensor gru_input, "
    "Tensor? w_ih, Tensor w_hh, Tensor w1s, Tensor w2, float temperature, int top_k, "
    "float top_p, Tensor? uniforms, bool write_logits, Tensor(b!) tokens, "
    "Tensor(c!) logprobs, Tensor(d!) state_out) -> ()";
inline constexpr const char* kSample =
    "sample(Tensor logits, float temperature, int top_k, float top_p, Tensor? uniforms, "
    "Tensor(a!) tokens) -> ()";
inline constexpr const char* kVerifyGreedy =
    "verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor(a!) out_tokens, "
    "Tensor(b!) num_accepted) -> ()";
inline constexpr const char* kVerifySampling =
    "verify_sampling(Tensor draft_tokens, Tensor draft_probs, Tensor target_probs, "
    "Tensor uniforms_accept, Tensor uniforms_resample, Tensor(a!) out_tokens, "
    "Tensor(b!) num_accepted) -> ()";
inline constexpr const char* kSmallBatchLinear =
    "small_batch_linear(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) out) -> ()";

}  // namespace domino::schemas
