// CUDA kernel of sample, as plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"
#include "sampling_params.h"

namespace domino::cuda {

// logits [b, V] float or bf16 (is_bf16); each row's parameters from `sampling` (the
// arrays in it on the device); uniforms [b] float64 when sampling.may_sample(), read only
// by rows at temperature > 0.
cudaError_t launch_sample(const void* logits, bool is_bf16, int64_t b, int64_t V, const SamplingParams& sampling,
                          const double* uniforms, int64_t* tokens, cudaStream_t stream);

}  // namespace domino::cuda
