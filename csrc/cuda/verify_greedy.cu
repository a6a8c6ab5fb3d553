// CUDA kernel of verify_greedy: longest draft prefix equal to the target's argmax.
//
// One block per sequence walks the target rows in order and stops at the first mismatch,
// so it reads at most (k+1)*V logits per sequence (16*151936*2 B = 4.9 MB per sequence in
// bf16 at the paper shape; ~1.5 us at 3.35 TB/s if it were alone on the device, in
// practice a few blocks and launch latency bound it). Each row is an argmax reduction:
// strided loads per thread, warp shuffles, then one shared-memory pass across warps; ties
// go to the lowest index, as torch.argmax. Draft ids are only compared, never used as
// addresses, so an out-of-range id is a mismatch rather than a fault.
#include <cuda_bf16.h>

#include "cuda/verify_greedy.cuh"

namespace domino::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_logit(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_logit(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ void argmax_merge(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void verify_greedy_kernel(const int64_t* __restrict__ draft,
                                     const T* __restrict__ logits, int64_t k, int64_t V,
                                     int64_t* __restrict__ out, int64_t* __restrict__ accepted) {
  __shared__ float warp_val[kThreads / 32];
  __shared__ int64_t warp_idx[kThreads / 32];
  __shared__ int64_t row_arg;
  const int64_t s = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t n = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const T* row = logits + (s * (k + 1) + i) * V;
    float best = -INFINITY;
    int64_t arg = INT64_MAX;
    for (int64_t j = threadIdx.x; j < V; j += kThreads) argmax_merge(best, arg, load_logit(row + j), j);
    for (int off = 16; off > 0; off /= 2) {
      const float ov = __shfl_down_sync(0xffffffffu, best, off);
      const int64_t oi = __shfl_down_sync(0xffffffffu, arg, off);
      argmax_merge(best, arg, ov, oi);
    }
    if (lane == 0) {
      warp_val[warp] = best;
      warp_idx[warp] = arg;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) argmax_merge(best, arg, warp_val[w], warp_idx[w]);
      row_arg = arg;
      out[s * (k + 1) + i] = arg;
    }
    __syncthreads();
    const int64_t target = row_arg;
    if (i == k || target != draft[s * k + i]) break;
    ++n;
    __syncthreads();  // row_arg is rewritten by the next row
  }
  if (threadIdx.x == 0) accepted[s] = n;
  for (int64_t i = n + 1 + threadIdx.x; i <= k; i += kThreads) out[s * (k + 1) + i] = -1;
}

}  // namespace

cudaError_t launch_verify_greedy(const int64_t* draft_tokens, const void* target_logits,
                                 bool is_bf16, int64_t b, int64_t k, int64_t V,
                                 int64_t* out_tokens, int64_t* num_accepted,
                                 cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(b)), block(kThreads);
  if (is_bf16)
    verify_greedy_kernel<<<grid, block, 0, stream>>>(
        draft_tokens, static_cast<const __nv_bfloat16*>(target_logits), k, V, out_tokens, num_accepted);
  else
    verify_greedy_kernel<<<grid, block, 0, stream>>>(
        draft_tokens, static_cast<const float*>(target_logits), k, V, out_tokens, num_accepted);
  return cudaGetLastError();
}

}  // namespace domino::cuda
