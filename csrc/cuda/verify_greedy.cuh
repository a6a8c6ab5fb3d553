// CUDA kernel of verify_greedy, as plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

// logits is float (is_bf16 = false) or __nv_bfloat16 (is_bf16 = true), [b, k+1, V].
cudaError_t launch_verify_greedy(const int64_t* draft_tokens, const void* target_logits,
                                 bool is_bf16, int64_t b, int64_t k, int64_t V,
                                 int64_t* out_tokens, int64_t* num_accepted,
                                 cudaStream_t stream);

}  // namespace domino::cuda
