// CUDA kernel of verify_sampling, as plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

// draft_probs [b, k, V], target_probs [b, k+1, V] float32; uniforms float64.
cudaError_t launch_verify_sampling(const int64_t* draft_tokens, const float* draft_probs,
                                   const float* target_probs, const double* uniforms_accept,
                                   const double* uniforms_resample, int64_t b, int64_t k, int64_t V,
                                   int64_t* out_tokens, int64_t* num_accepted, cudaStream_t stream);

}  // namespace domino::cuda
