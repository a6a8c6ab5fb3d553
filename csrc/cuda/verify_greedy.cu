// CUDA kernel of verify_greedy: longest draft prefix equal to the target's argmax.
//
// Bytes: one block per sequence walks the target rows in order and stops at the first
// mismatch, so it reads at most (k+1)*V logits per sequence: 16*151936*2 B = 4.9 MB per
// sequence in bf16 at the paper shape, a 1.5 us floor at 3.35 TB/s (fp32: 9.7 MB, 2.9 us). With one block per
// sequence only b SMs stream, so at small batch one SM's load rate (order 100 GB/s: ~50 us
// for the full 4.9 MB, less when a draft is rejected early) and the launch bound it, not
// HBM; splitting rows across blocks would need a grid-wide step. Each row is an argmax: strided
// loads per thread, warp shuffles, one shared-memory pass across warps; ties go to the
// lowest index, as torch.argmax. Draft ids are only compared, never used as addresses.
#include "cuda/row_sampler.cuh"
#include "cuda/verify_greedy.cuh"

namespace domino::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kSamplerThreads)
verify_greedy_kernel(const int64_t* __restrict__ draft, const T* __restrict__ logits, int64_t k,
                     int64_t V, int64_t* __restrict__ out, int64_t* __restrict__ accepted) {
  __shared__ RowScratch sh;
  const int64_t s = blockIdx.x;
  int64_t n = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const int64_t target = argmax_row(logits + (s * (k + 1) + i) * V, V, sh);
    if (threadIdx.x == 0) out[s * (k + 1) + i] = target;
    if (i == k || target != draft[s * k + i]) break;
    ++n;
  }
  if (threadIdx.x == 0) accepted[s] = n;
  for (int64_t i = n + 1 + threadIdx.x; i <= k; i += blockDim.x) out[s * (k + 1) + i] = -1;
}

}  // namespace

cudaError_t launch_verify_greedy(const int64_t* draft_tokens, const void* target_logits,
                                 bool is_bf16, int64_t b, int64_t k, int64_t V,
                                 int64_t* out_tokens, int64_t* num_accepted,
                                 cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(b)), block(kSamplerThreads);
  if (is_bf16)
    return DOMINO_LAUNCH(verify_greedy_kernel, grid, block, 0, stream, draft_tokens,
                         static_cast<const __nv_bfloat16*>(target_logits), k, V, out_tokens,
                         num_accepted);
  return DOMINO_LAUNCH(verify_greedy_kernel, grid, block, 0, stream, draft_tokens,
                       static_cast<const float*>(target_logits), k, V, out_tokens, num_accepted);
}

}  // namespace domino::cuda
