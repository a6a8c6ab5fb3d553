// CUDA kernel of verify_sampling (lossless rejection sampling), one block per sequence.
//
// Thread 0 walks the drafts: accept x_i iff u_i * q_i(x_i) < p_i(x_i) (float64, as the
// reference). At the first rejection n the block samples normalize(max(0, p_n - q_n)) (or
// p_k after k acceptances, or p_n itself if the residual is all zero) by inverse CDF with
// the sequence's resample uniform, scanning chunks of the row in index order. A target row
// with no positive mass (zeros, NaN, negatives: not a distribution) gives token 0, the
// sampling ops' rule for a row with no mass, in every backend.
//
// Bytes: 2k scalar probabilities, then one or two rows of V float32 (two passes, the
// second from L1/L2): 2*V*4 B = 1.2 MB per sequence at V = 151936, a 0.4 us floor at
// 3.35 TB/s; one SM per sequence and the block scans bound it in practice.
#include "cuda/row_sampler.cuh"
#include "cuda/verify_sampling.cuh"

namespace domino::cuda {
namespace {

__global__ void __launch_bounds__(kSamplerThreads)
verify_sampling_kernel(const int64_t* __restrict__ draft, const float* __restrict__ q,
                       const float* __restrict__ p, const double* __restrict__ u_accept,
                       const double* __restrict__ u_resample, int64_t k, int64_t V,
                       int64_t* __restrict__ out, int64_t* __restrict__ accepted) {
  __shared__ RowScratch sh;
  __shared__ int64_t n_shared;
  const int64_t s = blockIdx.x;
  if (threadIdx.x == 0) {
    int64_t n = 0;
    for (; n < k; ++n) {
      const int64_t x = draft[s * k + n];
      if (x < 0 || x >= V) break;  // unreachable through the checked wrappers; never an address
      const double px = p[(s * (k + 1) + n) * V + x], qx = q[(s * k + n) * V + x];
      if (!(u_accept[s * k + n] * qx < px)) break;
    }
    n_shared = n;
  }
  __syncthreads();
  const int64_t n = n_shared;
  const float* pn = p + (s * (k + 1) + n) * V;
  const float* qn = n < k ? q + (s * k + n) * V : nullptr;
  double residual = 0.0;
  if (qn != nullptr)
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      residual += fmax(static_cast<double>(pn[j]) - static_cast<double>(qn[j]), 0.0);
  const bool use_residual = block_sum(residual, sh.dsum) > 0.0;
  auto weight = [&](int64_t j, long long&) -> double {
    return use_residual ? fmax(static_cast<double>(pn[j]) - static_cast<double>(qn[j]), 0.0)
                        : fmax(static_cast<double>(pn[j]), 0.0);
  };
  const Pick pick = inverse_cdf_pick(weight, V, u_resample[s], 0, sh);
  for (int64_t i = threadIdx.x; i <= k; i += blockDim.x)
    out[s * (k + 1) + i] = i < n ? draft[s * k + i] : (i == n ? (pick.token < 0 ? 0 : pick.token) : -1);
  if (threadIdx.x == 0) accepted[s] = n;
}

}  // namespace

cudaError_t launch_verify_sampling(const int64_t* draft_tokens, const float* draft_probs,
                                   const float* target_probs, const double* uniforms_accept,
                                   const double* uniforms_resample, int64_t b, int64_t k, int64_t V,
                                   int64_t* out_tokens, int64_t* num_accepted, cudaStream_t stream) {
  return DOMINO_LAUNCH(verify_sampling_kernel, dim3(static_cast<unsigned>(b)), dim3(kSamplerThreads),
                       0, stream, draft_tokens, draft_probs, target_probs, uniforms_accept,
                       uniforms_resample, k, V, out_tokens, num_accepted);
}

}  // namespace domino::cuda
