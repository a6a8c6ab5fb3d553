// CUDA kernel of filtered_probs: one block per row, each with its own parameters
// (sampling_params.h). Temperature 0 writes the argmax's one-hot (torch.argmax: the first
// NaN wins); otherwise the row's filtered weights (row_sampler.cuh's filtered_row: the same
// law `sample` draws from, top-k and top-p found by bisection) over their float64 total.
//
// Bytes: V logits read per row (2 or 4 B each) and V float32 probabilities written (4 B):
// 0.6 MB a row at V = 151936 in bf16, a ~0.2 us floor at 3.35 TB/s. The max pass reads from
// HBM, the weight passes (two without top-k / top-p: the total, then the write) from L2,
// the threads on interleaved tokens (coalesced stores); with top-p each thread walks its
// own contiguous chunk in index order (tied tokens are kept by index), so those stores are
// not coalesced across a warp. L2 bandwidth and the block reductions, not HBM, limit a
// row; top-k / top-p add ~32 passes each.
#include "cuda/filtered_probs.cuh"
#include "cuda/row_sampler.cuh"

namespace domino::cuda {
namespace {

__device__ void one_hot(float* out, int64_t V, int64_t hot) {
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) out[j] = j == hot ? 1.0f : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(kSamplerThreads)
filtered_probs_kernel(const T* __restrict__ logits, int64_t V, SamplingParams sampling, float* __restrict__ probs) {
  __shared__ RowScratch sh;
  const int64_t s = blockIdx.x;
  const T* row = logits + s * V;
  float* out = probs + s * V;
  const float temperature = sampling.temperature_at(s);
  if (temperature == 0.0f) {
    one_hot(out, V, argmax_row(row, V, sh));
    return;
  }
  filtered_row(
      row, V, temperature, sampling.top_k_at(s), sampling.top_p_at(s), sh,
      [&] { one_hot(out, V, 0); },  // no mass: all of it on token 0, as the reference
      [&](const auto& weight, long long ties_before) {
        // Without top-p a token's weight does not depend on the tied tokens before it, so
        // the threads take interleaved tokens and a warp's stores are coalesced; with top-p
        // each walks its own chunk in index order, counting ties (uncoalesced stores).
        const bool by_chunk = sampling.top_p_at(s) < 1.0;
        int64_t begin, end, step;
        if (by_chunk) {
          thread_chunk(V, begin, end);
          step = 1;
        } else {
          begin = threadIdx.x, end = V, step = blockDim.x;
        }
        double part = 0.0;
        long long rank = ties_before;
        for (int64_t j = begin; j < end; j += step) part += weight(j, rank);
        const double total = block_sum(part, sh.dsum);
        rank = ties_before;
        for (int64_t j = begin; j < end; j += step) out[j] = static_cast<float>(weight(j, rank) / total);
      });
}

}  // namespace

cudaError_t launch_filtered_probs(const void* logits, bool is_bf16, int64_t b, int64_t V,
                                  const SamplingParams& sampling, float* probs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(b)), block(kSamplerThreads);
  if (is_bf16)
    return DOMINO_LAUNCH(filtered_probs_kernel, grid, block, 0, stream, static_cast<const __nv_bfloat16*>(logits), V,
                         sampling, probs);
  return DOMINO_LAUNCH(filtered_probs_kernel, grid, block, 0, stream, static_cast<const float*>(logits), V, sampling,
                       probs);
}

}  // namespace domino::cuda
