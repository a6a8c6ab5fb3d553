// CUDA kernel of sample, as plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

// logits [b, V] float or bf16 (is_bf16); uniforms [b] float64, unused at temperature 0.
cudaError_t launch_sample(const void* logits, bool is_bf16, int64_t b, int64_t V, float temperature,
                          int64_t top_k, double top_p, const double* uniforms, int64_t* tokens,
                          cudaStream_t stream);

}  // namespace domino::cuda
