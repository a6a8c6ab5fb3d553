// CUDA kernel of filtered_probs, as plain CUDA (no torch headers) behind a C++ launcher.
#pragma once

#include "cuda/portable.cuh"
#include "sampling_params.h"

namespace domino::cuda {

// logits [b, V] float or bf16 (is_bf16); each row's parameters from `sampling` (the
// arrays in it on the device); writes probs [b, V] float32: the one-hot of the argmax at
// temperature 0, else softmax(filter(logits / T)).
cudaError_t launch_filtered_probs(const void* logits, bool is_bf16, int64_t b, int64_t V,
                                  const SamplingParams& sampling, float* probs, cudaStream_t stream);

}  // namespace domino::cuda
