// CUDA kernel of sample: one block per row, each with its own parameters
// (sampling_params.h). Temperature 0 is an argmax (torch.argmax: the first NaN wins); otherwise the row
// is sampled by inverse CDF with the row's uniform, with top-k and top-p, exactly as the
// reference (see row_sampler.cuh for the method and its cost).
//
// Bytes: V logits per row once for the argmax (b*V*2 B in bf16: 0.3 MB per row at V =
// 151936, a 0.1 us floor at 3.35 TB/s; fp32 0.6 MB, 0.2 us); with sampling the first pass comes from HBM and the
// bisection passes from L2, so L2 bandwidth and the ~70 block-wide reductions, not HBM,
// limit it.
#include "cuda/row_sampler.cuh"
#include "cuda/sample.cuh"

namespace domino::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kSamplerThreads)
sample_kernel(const T* __restrict__ logits, int64_t V, SamplingParams sampling, const double* __restrict__ uniforms,
              int64_t* __restrict__ tokens) {
  __shared__ RowScratch sh;
  const int64_t s = blockIdx.x;
  const T* row = logits + s * V;
  const float temperature = sampling.temperature_at(s);
  int64_t token;
  if (temperature == 0.0f) token = argmax_row(row, V, sh);
  else token = sample_row(row, V, temperature, sampling.top_k_at(s), sampling.top_p_at(s), uniforms[s], sh).token;
  if (threadIdx.x == 0) tokens[s] = token;
}

}  // namespace

cudaError_t launch_sample(const void* logits, bool is_bf16, int64_t b, int64_t V, const SamplingParams& sampling,
                          const double* uniforms, int64_t* tokens, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(b)), block(kSamplerThreads);
  if (is_bf16)
    return DOMINO_LAUNCH(sample_kernel, grid, block, 0, stream,
                         static_cast<const __nv_bfloat16*>(logits), V, sampling, uniforms, tokens);
  return DOMINO_LAUNCH(sample_kernel, grid, block, 0, stream, static_cast<const float*>(logits), V,
                       sampling, uniforms, tokens);
}

}  // namespace domino::cuda
