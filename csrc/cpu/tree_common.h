// What the CPU tree-verify kernels (verify_tree_greedy and the two tree samplers) share, as
// csrc/cuda/tree_common.cuh is for the CUDA ones: the tree's index arrays as raw pointers,
// one request's walk, the samplers' probability rows, and the write pass. Each kernel first finds
// every request's accepted path and the token each path node emits, writing nothing (so a
// request that raises leaves the outputs as they were), then write_tree_paths writes them
// in sgl-kernel's layout.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace domino::cpu {

// A verified tree: bs requests of n nodes, paths of at most `steps` nodes
// (accept_index.size(1)), and its [bs, n] int64 index arrays (checked by the op's argument
// checks; their values by check_tree_links before they are used as addresses).
struct TreeView {
  int64_t bs, n, steps;
  const int64_t* cand;          // candidates
  const int64_t* ridx;          // retrive_index
  const int64_t* next_token;    // retrive_next_token
  const int64_t* next_sibling;  // retrive_next_sibling
};

inline TreeView tree_view(const at::Tensor& candidates, const at::Tensor& retrive_index,
                          const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                          const at::Tensor& accept_index) {
  return {candidates.size(0), candidates.size(1), accept_index.size(1), candidates.const_data_ptr<int64_t>(),
          retrive_index.const_data_ptr<int64_t>(), retrive_next_token.const_data_ptr<int64_t>(),
          retrive_next_sibling.const_data_ptr<int64_t>()};
}

// Request b's part of a walk down the tree: its links, and its slots in the walk's path and
// tokens arrays ([bs * steps] each); the path starts at the root (path[0] = 0).
struct RequestWalk {
  const int64_t* next_token;    // [n]
  const int64_t* next_sibling;  // [n]
  int64_t* path;                // [steps]
  int64_t* tokens;              // [steps]
};

inline RequestWalk request_walk(const TreeView& tree, int64_t b, std::vector<int64_t>& path,
                                std::vector<int64_t>& tokens) {
  int64_t* p = path.data() + b * tree.steps;
  p[0] = 0;
  return {tree.next_token + b * tree.n, tree.next_sibling + b * tree.n, p, tokens.data() + b * tree.steps};
}

// The probability rows a tree sampler reads, [bs, n, vocab] float32 (checked by the op's
// argument checks): the target's p, and the draft's q or null where the op has none.
struct TreeProbs {
  const float* p;
  const float* q;
  int64_t vocab;
};

inline TreeProbs tree_probs(const at::Tensor& target_probs, const at::Tensor* draft_probs) {
  return {target_probs.const_data_ptr<float>(),
          draft_probs != nullptr ? draft_probs->const_data_ptr<float>() : nullptr, target_probs.size(2)};
}

// path[b * steps + j]: the j-th node of request b's accepted path (j <= accepted[b], node 0
// the root); tokens[b * steps + j]: the token predicts gets at that node's slot (the next
// accepted token, or the last one drawn). predicts: -1 at every node's slot, then the
// tokens; accept_index: the path's retrive_index slots, then -1; accept_token_num: accepted.
inline void write_tree_paths(at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
                             const TreeView& tree, const std::vector<int64_t>& path,
                             const std::vector<int64_t>& tokens, const std::vector<int64_t>& accepted) {
  const int64_t bs = tree.bs, n = tree.n, steps = tree.steps;
  const int64_t* ridx = tree.ridx;
  int32_t* pred = predicts.data_ptr<int32_t>();
  int32_t* acc_index = accept_index.data_ptr<int32_t>();
  int32_t* acc_num = accept_token_num.data_ptr<int32_t>();
  for (int64_t i = 0; i < bs * n; ++i) pred[ridx[i]] = -1;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t* p = path.data() + b * steps;
    const int64_t* tok = tokens.data() + b * steps;
    const int64_t num = accepted[b];
    for (int64_t j = 0; j < steps; ++j)
      acc_index[b * steps + j] = j <= num ? static_cast<int32_t>(ridx[b * n + p[j]]) : -1;
    for (int64_t j = 0; j <= num; ++j) pred[ridx[b * n + p[j]]] = static_cast<int32_t>(tok[j]);
    acc_num[b] = static_cast<int32_t>(num);
  }
}

}  // namespace domino::cpu
