// CUDA kernel of verify_tree_greedy (sgl-kernel-compatible), as plain CUDA (no torch
// headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

// candidates, links, target_predict: [bs, n] int64; predicts: slot_limit addressable
// int32 slots (min(predicts.numel(), bs * n): retrive_index also addresses the flat
// target_predict); accept_index [bs, steps], accept_token_num [bs] int32.
cudaError_t launch_verify_tree_greedy(int32_t* predicts, int32_t* accept_index, int32_t* accept_token_num,
                                      const int64_t* candidates, const int64_t* retrive_index,
                                      const int64_t* retrive_next_token, const int64_t* retrive_next_sibling,
                                      const int64_t* target_predict, int64_t bs, int64_t n, int64_t steps,
                                      int64_t slot_limit, cudaStream_t stream);

}  // namespace domino::cuda
