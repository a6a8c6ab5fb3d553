// CUDA kernel of tree_speculative_sampling_target_only (sgl-kernel-compatible), as plain
// CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/tree_args.cuh"

namespace domino::cuda {

// Upper bound on the node count N: the kernel keeps the tokens of the children rejected at
// the last node in dynamic shared memory (N * 4 B, 32 KiB at this bound).
constexpr int64_t kTreeSamplingMaxNodes = 8192;

struct TreeSamplingArgs : TreeSamplerArgs<float> {
  float threshold_single, threshold_acc;
};

// Requires n <= kTreeSamplingMaxNodes and V < 2^31.
cudaError_t launch_tree_speculative_sampling_target_only(const TreeSamplingArgs& args, cudaStream_t stream);

}  // namespace domino::cuda
