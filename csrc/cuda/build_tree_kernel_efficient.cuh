// CUDA kernel of build_tree_kernel_efficient (sgl-kernel-compatible), as plain CUDA (no
// torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

// Upper bound on draft_token_num (N): the kernel keeps each node's parent and depth in
// dynamic shared memory (N * 8 B, 32 KiB at this bound).
constexpr int64_t kBuildTreeMaxNodes = 4096;

struct BuildTreeArgs {
  const int64_t* parent_list;  // [bs, parents]; nullptr when empty (depth 1)
  const int64_t* selected_index;  // [bs, n - 1]
  const int64_t* verified_seq_len;  // [bs]
  uint8_t* tree_mask;  // bool elements, or packed little-endian 1/2/4-byte words
  int64_t mask_numel;  // elements of tree_mask (bools, or packed words)
  int64_t* positions;  // >= bs * n
  int64_t* retrive_index;  // [bs, n]
  int64_t* retrive_next_token;  // [bs, n]
  int64_t* retrive_next_sibling;  // [bs, n]
  int64_t bs, topk, parents, n, mode;  // parents = topk * (depth - 1) + 1
};

// Requires n <= kBuildTreeMaxNodes.
cudaError_t launch_build_tree_kernel_efficient(const BuildTreeArgs& args, cudaStream_t stream);

}  // namespace domino::cuda
