// Argument checks of the tree ops that need no tensor values (see tree_ops.h). Every
// tensor must be contiguous (sgl-kernel addresses them through raw pointers) and on the
// device of the op's first index input; outputs must not overlap inputs or each other.
#include <c10/util/Exception.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "ops.h"
#include "tree_ops.h"

namespace domino {
namespace {

void check_tensor(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.defined(), name, " must be a tensor");
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the op runs on ", device);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_matrix(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t rows,
                  int64_t cols, const at::Device& device) {
  check_tensor(t, name, device);
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, name, " must have shape [",
              rows, ", ", cols, "], got ", t.sizes());
}

void check_vector(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t n,
                  const at::Device& device) {
  check_tensor(t, name, device);
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, name, " must have shape [", n, "], got ", t.sizes());
}

// Byte ranges of two contiguous tensors intersect.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

using Named = std::pair<const at::Tensor*, const char*>;

// Each output is disjoint from every input and from the other outputs.
void check_no_alias(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (const auto& i : inputs)
      TORCH_CHECK(!overlap(*o->first, *i.first), "output ", o->second, " overlaps input ", i.second);
    for (auto p = outputs.begin(); p != o; ++p)
      TORCH_CHECK(!overlap(*o->first, *p->first), "output ", o->second, " overlaps output ", p->second);
  }
}

// The outputs and tree links shared by verify_tree_greedy and the tree sampler.
void check_tree_verify_common(const at::Tensor& predicts, const at::Tensor& accept_index,
                              const at::Tensor& accept_token_num, const at::Tensor& candidates,
                              const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                              const at::Tensor& retrive_next_sibling, const at::Device& dev) {
  check_tensor(candidates, "candidates", dev);
  TORCH_CHECK(candidates.scalar_type() == at::kLong, "candidates must be int64, got ",
              candidates.scalar_type());
  TORCH_CHECK(candidates.dim() == 2 && candidates.size(1) > 0,
              "candidates must have shape [bs, num_draft_tokens] with num_draft_tokens >= 1, got ",
              candidates.sizes());
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  check_matrix(retrive_index, "retrive_index", at::kLong, bs, n, dev);
  check_matrix(retrive_next_token, "retrive_next_token", at::kLong, bs, n, dev);
  check_matrix(retrive_next_sibling, "retrive_next_sibling", at::kLong, bs, n, dev);
  check_tensor(predicts, "predicts", dev);
  TORCH_CHECK(predicts.scalar_type() == at::kInt, "predicts must be int32, got ", predicts.scalar_type());
  TORCH_CHECK(predicts.dim() == 1, "predicts must have 1 dimension, got shape ", predicts.sizes());
  check_tensor(accept_index, "accept_index", dev);
  TORCH_CHECK(accept_index.scalar_type() == at::kInt, "accept_index must be int32, got ",
              accept_index.scalar_type());
  TORCH_CHECK(accept_index.dim() == 2 && accept_index.size(0) == bs && accept_index.size(1) >= 1,
              "accept_index must have shape [", bs, ", num_spec_step] with num_spec_step >= 1, got ",
              accept_index.sizes());
  check_vector(accept_token_num, "accept_token_num", at::kInt, bs, dev);
}

}  // namespace

void check_build_tree_args(const at::Tensor& parent_list, const at::Tensor& selected_index,
                           const at::Tensor& verified_seq_len, const at::Tensor& tree_mask,
                           const at::Tensor& positions, const at::Tensor& retrive_index,
                           const at::Tensor& retrive_next_token,
                           const at::Tensor& retrive_next_sibling, int64_t topk, int64_t depth,
                           int64_t draft_token_num, int64_t tree_mask_mode) {
  TORCH_CHECK(topk >= 1, "topk must be >= 1, got ", topk);
  TORCH_CHECK(depth >= 1, "depth must be >= 1, got ", depth);
  TORCH_CHECK(draft_token_num >= 1, "draft_token_num must be >= 1, got ", draft_token_num);
  TORCH_CHECK(tree_mask_mode == kFullMask || tree_mask_mode == kQlenOnly ||
                  tree_mask_mode == kQlenOnlyBitpacking,
              "tree_mask_mode must be 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING), got ",
              tree_mask_mode);
  TORCH_CHECK(tree_mask_mode != kQlenOnlyBitpacking || draft_token_num <= 32,
              "QLEN_ONLY_BITPACKING packs a row into at most 32 bits: draft_token_num must be <= 32, got ",
              draft_token_num);
  // parent_list stride of sgl-kernel; guards against topk*depth overflow before it is used.
  TORCH_CHECK(topk <= (int64_t{1} << 20) && depth <= (int64_t{1} << 20), "topk and depth must be <= 2^20");
  const int64_t n = draft_token_num, parents = topk * (depth - 1) + 1;

  const at::Device dev = selected_index.device();
  check_tensor(selected_index, "selected_index", dev);
  TORCH_CHECK(selected_index.scalar_type() == at::kLong, "selected_index must be int64, got ",
              selected_index.scalar_type());
  TORCH_CHECK(selected_index.dim() == 2 && selected_index.size(1) == n - 1,
              "selected_index must have shape [bs, draft_token_num - 1] = [bs, ", n - 1, "], got ",
              selected_index.sizes());
  const int64_t bs = selected_index.size(0);
  check_tensor(parent_list, "parent_list", dev);
  TORCH_CHECK(parent_list.dim() == 2 && parent_list.size(0) == bs,
              "parent_list must have shape [", bs, ", topk * (depth - 1) + 1], got ", parent_list.sizes());
  // With depth 1 no parent is ever read; SGLang then passes an empty [bs, 0] float tensor.
  if (!(depth == 1 && parent_list.size(1) == 0)) {
    TORCH_CHECK(parent_list.size(1) == parents, "parent_list must have shape [", bs,
                ", topk * (depth - 1) + 1] = [", bs, ", ", parents, "], got ", parent_list.sizes());
    TORCH_CHECK(parent_list.scalar_type() == at::kLong, "parent_list must be int64, got ",
                parent_list.scalar_type());
  }
  check_vector(verified_seq_len, "verified_seq_len", at::kLong, bs, dev);

  check_tensor(tree_mask, "tree_mask", dev);
  if (tree_mask_mode == kQlenOnlyBitpacking) {
    const auto st = tree_mask.scalar_type();
    const int64_t bytes = tree_mask_packed_bytes(n);
    const bool integral = at::isIntegralType(st, /*includeBool=*/false);
    TORCH_CHECK(integral && tree_mask.element_size() == bytes, "tree_mask in QLEN_ONLY_BITPACKING mode "
                "must be an integer dtype of ", bytes, " byte(s) per row for draft_token_num = ", n,
                " (uint8 for N <= 8, uint16 for N <= 16, uint32 for N <= 32), got ", st);
    TORCH_CHECK(tree_mask.numel() >= bs * n, "tree_mask must hold bs * draft_token_num = ", bs * n,
                " packed rows, got ", tree_mask.numel());
  } else {
    TORCH_CHECK(tree_mask.scalar_type() == at::kBool, "tree_mask must be bool in mode ", tree_mask_mode,
                ", got ", tree_mask.scalar_type());
    if (tree_mask_mode == kQlenOnly)
      TORCH_CHECK(tree_mask.numel() >= bs * n * n, "tree_mask must hold bs * draft_token_num^2 = ",
                  bs * n * n, " elements in QLEN_ONLY mode, got ", tree_mask.numel());
    // FULL_MASK's size depends on verified_seq_len's values: checked by the kernel.
  }
  check_tensor(positions, "positions", dev);
  TORCH_CHECK(positions.scalar_type() == at::kLong, "positions must be int64, got ", positions.scalar_type());
  TORCH_CHECK(positions.numel() >= bs * n, "positions must hold bs * draft_token_num = ", bs * n,
              " elements, got ", positions.numel());
  check_matrix(retrive_index, "retrive_index", at::kLong, bs, n, dev);
  check_matrix(retrive_next_token, "retrive_next_token", at::kLong, bs, n, dev);
  check_matrix(retrive_next_sibling, "retrive_next_sibling", at::kLong, bs, n, dev);
  check_no_alias({{&tree_mask, "tree_mask"}, {&positions, "positions"}, {&retrive_index, "retrive_index"},
                  {&retrive_next_token, "retrive_next_token"}, {&retrive_next_sibling, "retrive_next_sibling"}},
                 {{&parent_list, "parent_list"}, {&selected_index, "selected_index"},
                  {&verified_seq_len, "verified_seq_len"}});
}

void check_tree_links(const int64_t* ridx, const int64_t* next_token, const int64_t* next_sibling, int64_t bs,
                      int64_t n, int64_t index_limit, const char* index_limit_desc) {
  for (int64_t i = 0; i < bs * n; ++i) {
    TORCH_CHECK(ridx[i] >= 0 && ridx[i] < index_limit, "retrive_index must be in [0, ", index_limit_desc,
                ") = [0, ", index_limit, "), got ", ridx[i], " at flat index ", i);
    TORCH_CHECK(next_token[i] >= -1 && next_token[i] < n, "retrive_next_token must be -1 or a node in [0, ", n,
                "), got ", next_token[i], " at flat index ", i);
    TORCH_CHECK(next_sibling[i] >= -1 && next_sibling[i] < n, "retrive_next_sibling must be -1 or a node in [0, ",
                n, "), got ", next_sibling[i], " at flat index ", i);
  }
  // A tree in first-child / next-sibling links: every node but the root is named by at most
  // one link (its parent's first child or its previous sibling) and the root by none. Then
  // no walk from the root meets a node twice, so it ends within n nodes and a path never
  // repeats a node (a cycle, or the root as a child, would let a 2-node tree "accept" as
  // many tokens as accept_index has columns).
  std::vector<int64_t> named_by(n);
  for (int64_t b = 0; b < bs; ++b) {
    std::fill(named_by.begin(), named_by.end(), -1);
    for (const auto& [links, name] : {std::pair{next_token, "retrive_next_token"},
                                      std::pair{next_sibling, "retrive_next_sibling"}}) {
      for (int64_t u = 0; u < n; ++u) {
        const int64_t v = links[b * n + u];
        if (v == -1) continue;
        TORCH_CHECK(v != 0, name, " of request ", b, " names the root (node 0) at node ", u,
                    ": the links do not form a tree");
        TORCH_CHECK(named_by[v] == -1, name, " of request ", b, " names node ", v,
                    " a second time (at node ", u, "): the links do not form a tree");
        named_by[v] = u;
      }
    }
  }
}

void check_verify_tree_greedy_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                   const at::Tensor& accept_token_num,
                                   const at::Tensor& candidates, const at::Tensor& retrive_index,
                                   const at::Tensor& retrive_next_token,
                                   const at::Tensor& retrive_next_sibling,
                                   const at::Tensor& target_predict) {
  const at::Device dev = candidates.device();
  check_tree_verify_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, dev);
  check_matrix(target_predict, "target_predict", at::kLong, candidates.size(0), candidates.size(1), dev);
  check_no_alias({{&predicts, "predicts"}, {&accept_index, "accept_index"}, {&accept_token_num, "accept_token_num"}},
                 {{&candidates, "candidates"}, {&retrive_index, "retrive_index"},
                  {&retrive_next_token, "retrive_next_token"}, {&retrive_next_sibling, "retrive_next_sibling"},
                  {&target_predict, "target_predict"}});
}

namespace {

// The inputs and outputs shared by the two tree samplers: uniforms of `uniform_dtype` in
// [0, 1) ([0, 1] where `coins_closed`), target_probs [bs, n, V] float32, draft_probs
// (undefined when None) of the same shape.
void check_tree_sampler_common(const at::Tensor& predicts, const at::Tensor& accept_index,
                               const at::Tensor& accept_token_num, const at::Tensor& candidates,
                               const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                               const at::Tensor& retrive_next_sibling, const at::Tensor& uniform_samples,
                               const at::Tensor& uniform_samples_for_final_sampling,
                               const at::Tensor& target_probs, const at::Tensor& draft_probs,
                               at::ScalarType uniform_dtype, bool coins_closed) {
  const at::Device dev = candidates.device();
  check_tree_verify_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, dev);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  check_matrix(uniform_samples, "uniform_samples", uniform_dtype, bs, n, dev);
  check_vector(uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling", uniform_dtype, bs, dev);
  check_unit_interval(uniform_samples, "uniform_samples", coins_closed);
  check_unit_interval(uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling", coins_closed);
  check_tensor(target_probs, "target_probs", dev);
  TORCH_CHECK(target_probs.scalar_type() == at::kFloat, "target_probs must be float32, got ",
              target_probs.scalar_type());
  TORCH_CHECK(target_probs.dim() == 3 && target_probs.size(0) == bs && target_probs.size(1) == n &&
                  target_probs.size(2) > 0,
              "target_probs must have shape [", bs, ", ", n, ", vocab_size], got ", target_probs.sizes());
  if (draft_probs.defined()) {
    check_tensor(draft_probs, "draft_probs", dev);
    TORCH_CHECK(draft_probs.scalar_type() == at::kFloat, "draft_probs must be float32, got ",
                draft_probs.scalar_type());
    TORCH_CHECK(draft_probs.sizes() == target_probs.sizes(), "draft_probs must have the shape of target_probs ",
                target_probs.sizes(), ", got ", draft_probs.sizes());
  }
  check_no_alias({{&predicts, "predicts"}, {&accept_index, "accept_index"}, {&accept_token_num, "accept_token_num"}},
                 {{&candidates, "candidates"}, {&retrive_index, "retrive_index"},
                  {&retrive_next_token, "retrive_next_token"}, {&retrive_next_sibling, "retrive_next_sibling"},
                  {&uniform_samples, "uniform_samples"},
                  {&uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling"},
                  {&target_probs, "target_probs"}, {&draft_probs, "draft_probs"}});
}

}  // namespace

void check_tree_sampling_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                              const at::Tensor& accept_token_num, const at::Tensor& candidates,
                              const at::Tensor& retrive_index,
                              const at::Tensor& retrive_next_token,
                              const at::Tensor& retrive_next_sibling,
                              const at::Tensor& uniform_samples,
                              const at::Tensor& uniform_samples_for_final_sampling,
                              const at::Tensor& target_probs,
                              const std::optional<at::Tensor>& draft_probs,
                              double threshold_single, double threshold_acc) {
  check_tree_sampler_common(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                            draft_probs.has_value() ? *draft_probs : at::Tensor(), at::kFloat,
                            /*coins_closed=*/true);  // sgl-kernel takes a coin of 1 (e.g. 1 - torch.rand)
  // sgl-kernel's range (NaN fails both comparisons).
  TORCH_CHECK(threshold_single >= 0.0 && threshold_single <= 1.0, "threshold_single must be in [0, 1], got ",
              threshold_single);
  TORCH_CHECK(threshold_acc >= 0.0 && threshold_acc <= 1.0, "threshold_acc must be in [0, 1], got ", threshold_acc);
}

void check_verify_tree_sampling_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                     const at::Tensor& accept_token_num, const at::Tensor& candidates,
                                     const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                                     const at::Tensor& retrive_next_sibling, const at::Tensor& uniform_samples,
                                     const at::Tensor& uniform_samples_for_final_sampling,
                                     const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  TORCH_CHECK(draft_probs.defined(), "draft_probs must be a tensor");
  check_tree_sampler_common(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                            draft_probs, at::kDouble, /*coins_closed=*/false);
}

}  // namespace domino
