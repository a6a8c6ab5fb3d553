// CUDA kernels of domino_head_expand (one step of Domino tree drafting for a frontier of
// nodes), as plain CUDA (no torch headers) behind a C++ launcher. The arguments are the
// rollout's (domino_head_rollout.cuh), with the expand fields set.
#pragma once

#include "cuda/domino_head_rollout.cuh"

namespace domino::cuda {

// Workspace of an expand step: the rollout's for b = n nodes (no filter row: the logits go
// to node_logits) and, when sampling, one float64 weight row per node [n, V].
int64_t head_expand_workspace_floats(int64_t n, int64_t V, int64_t r, int64_t G, bool may_sample);

// Launches the step's five kernels on `stream` (no host synchronisation, no allocation).
// Requires args.b <= 65535 (the nodes are the grids' y dimension).
cudaError_t launch_domino_head_expand(const HeadRolloutArgs& args, cudaStream_t stream);

}  // namespace domino::cuda
