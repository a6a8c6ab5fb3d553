// The write pass shared by the CPU tree-verify kernels (verify_tree_greedy and the two
// tree samplers): each kernel first finds every request's accepted path and the token
// each path node emits, writing nothing (so a request that raises leaves the outputs as
// they were), then this writes them in sgl-kernel's layout.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace domino::cpu {

// path[b * steps + j]: the j-th node of request b's accepted path (j <= accepted[b], node 0
// the root); tokens[b * steps + j]: the token predicts gets at that node's slot (the next
// accepted token, or the last one drawn). predicts: -1 at every node's slot, then the
// tokens; accept_index: the path's retrive_index slots, then -1; accept_token_num: accepted.
inline void write_tree_paths(at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
                             const int64_t* ridx, int64_t bs, int64_t n, int64_t steps,
                             const std::vector<int64_t>& path, const std::vector<int64_t>& tokens,
                             const std::vector<int64_t>& accepted) {
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
