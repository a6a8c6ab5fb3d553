// CUDA kernel of verify_tree_sampling (recursive rejection sampling over a draft tree), as
// plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/tree_args.cuh"

namespace domino::cuda {

struct VerifyTreeSamplingArgs : TreeSamplerArgs<double> {
  double* workspace;  // verify_tree_sampling_workspace_doubles(bs, V)
};

// The current target and draft rows of every request, float64: [bs, 2, V].
inline int64_t verify_tree_sampling_workspace_doubles(int64_t bs, int64_t V) { return 2 * bs * V; }

// Requires V < 2^31.
cudaError_t launch_verify_tree_sampling(const VerifyTreeSamplingArgs& args, cudaStream_t stream);

}  // namespace domino::cuda
