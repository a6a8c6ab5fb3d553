// The schema of every op, once: defined as domino_ops (torch_library.cpp) and, for the
// emulated CUDA kernels used by the tests, as domino_simt (simt/emulated_module.cpp).
// Outputs are passed in (mutated, `!`) so that a caller can reuse buffers and capture a
// decode loop in a CUDA graph. Sampling ops take scalar temperature / top_k / top_p and,
// optionally, per-row [b] tensors (float32 / int64 / float32) that override them row by
// row (csrc/sampling_params.h); they come last, with defaults, so scalar calls are unchanged.
#pragma once

#include <torch/library.h>

namespace domino::schemas {

inline constexpr const char* kDominoHeadRollout =
    "domino_head_rollout(Tensor(a!) base_logits, Tensor hproj, Tensor state, Tensor gru_input, "
    "Tensor? w_ih, Tensor w_hh, Tensor w1s, Tensor w2, float temperature, int top_k, "
    "float top_p, Tensor? uniforms, bool write_logits, Tensor(b!) tokens, "
    "Tensor(c!) logprobs, Tensor(d!) state_out, Tensor? row_temperature=None, Tensor? row_top_k=None, "
    "Tensor? row_top_p=None) -> ()";
inline constexpr const char* kSample =
    "sample(Tensor logits, float temperature, int top_k, float top_p, Tensor? uniforms, "
    "Tensor(a!) tokens, Tensor? row_temperature=None, Tensor? row_top_k=None, Tensor? row_top_p=None) -> ()";
// The distribution `sample` draws from, softmax(filter(logits / temperature)) per row, as
// float32 probabilities (the p / q that verify_sampling takes); temperature 0: the argmax's
// one-hot.
inline constexpr const char* kFilteredProbs =
    "filtered_probs(Tensor logits, float temperature, int top_k, float top_p, Tensor(a!) probs, "
    "Tensor? row_temperature=None, Tensor? row_top_k=None, Tensor? row_top_p=None) -> ()";
inline constexpr const char* kVerifyGreedy =
    "verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor(a!) out_tokens, "
    "Tensor(b!) num_accepted) -> ()";
inline constexpr const char* kVerifySampling =
    "verify_sampling(Tensor draft_tokens, Tensor draft_probs, Tensor target_probs, "
    "Tensor uniforms_accept, Tensor uniforms_resample, Tensor(a!) out_tokens, "
    "Tensor(b!) num_accepted) -> ()";
inline constexpr const char* kSmallBatchLinear =
    "small_batch_linear(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) out) -> ()";
// The same product with the weight packed ahead of time into VNNI panels
// (domino_ops.pack_small_batch_linear_weight); bf16 x, CPUs with AVX512-BF16. The panels
// carry no in_features: the op takes K from x and checks only that the panels cover K
// and out_features (panels are padded to whole column pairs and whole panels of rows, so
// x of K = 3 on panels packed from K = 4 reads their first three columns); the wrapper,
// whose PackedLinearWeight records both sizes, refuses any mismatch.
inline constexpr const char* kSmallBatchLinearPacked =
    "small_batch_linear_packed(Tensor x, Tensor packed_weight, int out_features, Tensor? bias, Tensor(a!) out) -> ()";
// An nn.Linear switched by domino.fast_linear, its forward in one call: the product above
// (on packed_weight's panels when given, else small_batch_linear) where the kernels apply,
// at::linear elsewhere (cpu/switched_linear.cpp; CompositeImplicitAutograd). Returns out.
inline constexpr const char* kSwitchedLinear =
    "switched_linear(Tensor x, Tensor weight, Tensor? bias, Tensor? packed_weight) -> Tensor";
inline constexpr const char* kSmallBatchAttention =
    "small_batch_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor(a!) out) -> ()";
// A decoder layer's row-wise ops in HF's rounding order, batch-invariant (CPU).
inline constexpr const char* kRmsNorm = "rms_norm(Tensor input, Tensor weight, float eps, Tensor(a!) out) -> ()";
inline constexpr const char* kSiluMul = "silu_mul(Tensor gate, Tensor up, Tensor(a!) out) -> ()";
inline constexpr const char* kApplyRotaryPosEmb =
    "apply_rotary_pos_emb(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor(a!) q_out, Tensor(b!) k_out) -> ()";
// A causal LM's decoder layers in one call over those kernels (cpu/decoder_layers.cpp):
// domino.fast_forward's loop in C++. weights: 12 per layer (None where a layer has none),
// eps: 3 per layer, scale: 1 per layer, heads: [Hq, Hkv, head dim, intermediate]; the new
// keys and values are written into the stores at past .. past + T - 1.
inline constexpr const char* kDecoderLayers =
    "decoder_layers(Tensor x, Tensor cos, Tensor sin, Tensor? mask, Tensor?[] weights, int[] heads, float[] eps, "
    "float[] scale, Tensor(a!)[] key_stores, Tensor(b!)[] value_stores, int past, bool keep_hidden) -> Tensor[]";
// A Domino drafter's backbone layers in one call over the same kernels (cpu/draft_layers.cpp):
// domino.model.DraftLayer on domino.fast_layers' fused forwards, in C++. weights / eps / heads
// as decoder_layers; the last layer computes the block rows row_start .. row_stop - 1. The
// context is the stores' first `past` slots; the block's keys and values are written after
// them as scratch (the context's slots are not changed).
inline constexpr const char* kDraftLayers =
    "draft_layers(Tensor x, Tensor cos, Tensor sin, Tensor mask, Tensor(a!)[] key_stores, Tensor(b!)[] value_stores, "
    "int past, Tensor?[] weights, int[] heads, float[] eps, int row_start, int row_stop) -> Tensor";
// A Domino drafter's context extension in one call over the same kernels
// (cpu/draft_context.cpp): the new slots' hidden_norm(fc(features)), then each layer's
// normed, rotated keys and its values of them, written into the stores at past .. past + T - 1.
// weights: 3 per layer (k/v packed as one product, its bias, k_norm), eps: 1 per layer,
// heads: [Hkv, head dim].
inline constexpr const char* kDraftContext =
    "draft_context(Tensor features, Tensor cos, Tensor sin, Tensor fc_packed, Tensor? fc_bias, "
    "Tensor hidden_norm_weight, float hidden_eps, Tensor(a!)[] key_stores, Tensor(b!)[] value_stores, int past, "
    "Tensor?[] weights, int[] heads, float[] eps) -> ()";

// The sgl-kernel-compatible tree ops (csrc/tree_ops.h): sgl-kernel's signatures, with
// draft_probs optional (newer sgl-kernel releases dropped it).
inline constexpr const char* kBuildTreeKernelEfficient =
    "build_tree_kernel_efficient(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
    "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
    "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()";
inline constexpr const char* kVerifyTreeGreedy =
    "verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
    "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
    "Tensor target_predict) -> ()";
inline constexpr const char* kTreeSpeculativeSamplingTargetOnly =
    "tree_speculative_sampling_target_only(Tensor(a!) predicts, Tensor(b!) accept_index, "
    "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
    "Tensor retrive_next_sibling, Tensor uniform_samples, Tensor uniform_samples_for_final_sampling, "
    "Tensor target_probs, Tensor? draft_probs, float threshold_single, float threshold_acc, "
    "bool deterministic) -> ()";
// One step of Domino tree drafting: the children of a frontier of nodes and their GRU states.
// w2_packed, w_hh_packed (CPU only): w2 and w_hh in pack_small_batch_linear_weight's layout,
// for its faster product. row_temperature / row_top_k / row_top_p: [b], one per sequence
// (base_logits' rows), node f reading those of node_seq[f].
inline constexpr const char* kDominoHeadExpand =
    "domino_head_expand(Tensor base_logits, Tensor hproj, Tensor node_state, Tensor node_seq, Tensor node_depth, "
    "Tensor gru_input, Tensor? w_ih, Tensor w_hh, Tensor w1s, Tensor w2, float temperature, int top_k, "
    "float top_p, Tensor? uniforms, Tensor(a!) child_tokens, Tensor(b!) child_logprobs, Tensor(c!) child_state, "
    "Tensor(d!)? node_logits, Tensor? w2_packed=None, Tensor? w_hh_packed=None, Tensor? row_temperature=None, "
    "Tensor? row_top_k=None, Tensor? row_top_p=None) -> ()";
// Lossless tree verification with the draft's probabilities (recursive rejection sampling):
// the tree sampler's layout, float64 uniforms as verify_sampling's, draft_probs required.
inline constexpr const char* kVerifyTreeSampling =
    "verify_tree_sampling(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
    "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
    "Tensor uniform_samples, Tensor uniform_samples_for_final_sampling, Tensor target_probs, "
    "Tensor draft_probs) -> ()";

// Defines the kernel ops (the six Domino ops and the four tree ops) in a library:
//   TORCH_LIBRARY(ns, m) { domino::schemas::define_ops(m); }
inline void define_ops(torch::Library& m) {
  m.def(kDominoHeadRollout);
  m.def(kDominoHeadExpand);
  m.def(kSample);
  m.def(kFilteredProbs);
  m.def(kVerifyGreedy);
  m.def(kVerifySampling);
  m.def(kBuildTreeKernelEfficient);
  m.def(kVerifyTreeGreedy);
  m.def(kTreeSpeculativeSamplingTargetOnly);
  m.def(kVerifyTreeSampling);
}

}  // namespace domino::schemas
