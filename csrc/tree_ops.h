// The tree ops (issue 13): their shared argument checks.
// build_tree_kernel_efficient, verify_tree_greedy and tree_speculative_sampling_target_only
// have sgl-kernel's names, argument order, dtypes and in-place outputs (sgl-project/sglang,
// sgl-kernel/csrc/speculative/), so an engine that calls those can call
// torch.ops.domino_ops.<op> instead. verify_tree_sampling is this project's lossless tree
// sampler that uses the draft's probabilities, in the same layout.
//
// The checks here cover what can be checked without reading tensor values (ranks, shapes,
// dtypes, devices, contiguity, outputs aliasing inputs or each other). The index values
// read from inputs (parent_list, selected_index, verified_seq_len, candidates, retrive_*)
// are checked by each kernel before it uses them as an address; they raise RuntimeError
// naming the argument, and a kernel that raises has written nothing.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace domino {

// sgl-kernel's TreeMaskMode.
enum TreeMaskMode : int64_t { kFullMask = 0, kQlenOnly = 1, kQlenOnlyBitpacking = 2 };

// Bytes per packed row in QLEN_ONLY_BITPACKING mode: 1, 2 or 4 for N <= 8, 16, 32.
inline int64_t tree_mask_packed_bytes(int64_t draft_token_num) {
  return draft_token_num > 16 ? 4 : (draft_token_num > 8 ? 2 : 1);
}

void check_build_tree_args(const at::Tensor& parent_list, const at::Tensor& selected_index,
                           const at::Tensor& verified_seq_len, const at::Tensor& tree_mask,
                           const at::Tensor& positions, const at::Tensor& retrive_index,
                           const at::Tensor& retrive_next_token,
                           const at::Tensor& retrive_next_sibling, int64_t topk, int64_t depth,
                           int64_t draft_token_num, int64_t tree_mask_mode);
void check_verify_tree_greedy_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                   const at::Tensor& accept_token_num,
                                   const at::Tensor& candidates, const at::Tensor& retrive_index,
                                   const at::Tensor& retrive_next_token,
                                   const at::Tensor& retrive_next_sibling,
                                   const at::Tensor& target_predict);
void check_tree_sampling_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                              const at::Tensor& accept_token_num, const at::Tensor& candidates,
                              const at::Tensor& retrive_index,
                              const at::Tensor& retrive_next_token,
                              const at::Tensor& retrive_next_sibling,
                              const at::Tensor& uniform_samples,
                              const at::Tensor& uniform_samples_for_final_sampling,
                              const at::Tensor& target_probs,
                              const std::optional<at::Tensor>& draft_probs,
                              double threshold_single, double threshold_acc);
void check_verify_tree_sampling_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                     const at::Tensor& accept_token_num, const at::Tensor& candidates,
                                     const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                                     const at::Tensor& retrive_next_sibling, const at::Tensor& uniform_samples,
                                     const at::Tensor& uniform_samples_for_final_sampling,
                                     const at::Tensor& target_probs, const at::Tensor& draft_probs);

// The index values of a tree the verify kernels walk, read before any is used as an
// address (bs * n entries each): retrive_index in [0, index_limit), described in errors as
// "[0, <index_limit_desc>) = [0, index_limit)"; the links -1 or a node in [0, n), forming
// a tree: the root named by no link, every other node by at most one.
void check_tree_links(const int64_t* retrive_index, const int64_t* retrive_next_token,
                      const int64_t* retrive_next_sibling, int64_t bs, int64_t n, int64_t index_limit,
                      const char* index_limit_desc);

}  // namespace domino
