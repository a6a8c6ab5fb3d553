// TEST INFRASTRUCTURE: small CUDA kernels that test the SIMT emulator itself (reductions,
// deliberately missing __syncthreads, divergent barriers, shuffles, votes, atomics, launch
// limits). Run from tests/test_simt_emulator.py through the domino_simt module, and from a
// ThreadSanitizer build of tsan_main.cpp.
#pragma once

#include <vector>

#include "cuda/portable.cuh"

namespace domino::simt_selftest {

// Tree reduction in shared memory; with kSync false the barriers are missing (a bug the
// emulator must expose).
template <bool kSync>
__global__ void block_sum_kernel(const float* x, int n, float* out) {
  DOMINO_DYNAMIC_SHARED(float, buf);
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += x[i];
  buf[threadIdx.x] = v;
  if (kSync) __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
    if (kSync) __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, buf[0]);
}

inline float block_sum(const std::vector<float>& x, int blocks, int threads, bool sync) {
  float out = 0.0f;
  const size_t smem = threads * sizeof(float);
  if (sync)
    DOMINO_LAUNCH(block_sum_kernel<true>, dim3(blocks), dim3(threads), smem, nullptr, x.data(),
                  static_cast<int>(x.size()), &out);
  else
    DOMINO_LAUNCH(block_sum_kernel<false>, dim3(blocks), dim3(threads), smem, nullptr, x.data(),
                  static_cast<int>(x.size()), &out);
  return out;
}

// Each block rotates its slice of x through shared memory: out[t] = x[(t + offset) mod T]
// within the block; with kSync false the barrier between the writes and the reads is
// missing, and a thread reads its neighbour's slot, lower or higher, maybe unwritten (NaN).
template <bool kSync>
__global__ void rotate_kernel(const float* x, int offset, float* out) {
  DOMINO_DYNAMIC_SHARED(float, buf);
  const int T = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  const int base = static_cast<int>(blockIdx.x) * T;
  buf[t] = x[base + t];
  if (kSync) __syncthreads();
  out[base + t] = buf[((t + offset) % T + T) % T];
}

inline std::vector<float> rotate(const std::vector<float>& x, int blocks, int offset, bool sync) {
  const int threads = static_cast<int>(x.size()) / blocks;
  std::vector<float> out(x.size(), 0.0f);
  const size_t smem = threads * sizeof(float);
  if (sync)
    DOMINO_LAUNCH(rotate_kernel<true>, dim3(blocks), dim3(threads), smem, nullptr, x.data(), offset, out.data());
  else
    DOMINO_LAUNCH(rotate_kernel<false>, dim3(blocks), dim3(threads), smem, nullptr, x.data(), offset, out.data());
  return out;
}

// Per thread (8 values): shfl_down 1, shfl_up 3, shfl_xor 5, shfl from lane 7, shfl_down 2
// with width 16, ballot(lane % 3 == 0), any(lane == 31), all(lane < 40).
__global__ void warp_ops_kernel(int* out) {
  const int t = threadIdx.x, lane = t % 32;
  const int v = 100 * t;
  int* o = out + 8 * t;
  o[0] = __shfl_down_sync(0xffffffffu, v, 1);
  o[1] = __shfl_up_sync(0xffffffffu, v, 3);
  o[2] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[3] = __shfl_sync(0xffffffffu, v, 7);
  o[4] = __shfl_down_sync(0xffffffffu, v, 2, 16);
  o[5] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  o[6] = __any_sync(0xffffffffu, lane == 31);
  o[7] = __all_sync(0xffffffffu, lane < 40);
}

inline std::vector<int> warp_ops(int threads) {
  std::vector<int> out(8 * threads, -7);
  DOMINO_LAUNCH(warp_ops_kernel, dim3(1), dim3(threads), 0, nullptr, out.data());
  return out;
}

// Every thread of every block: atomicAdd(counter, 1), atomicMax(max, global id),
// and a CAS-loop increment of a second counter.
__global__ void atomics_kernel(int* counter, int* maximum, unsigned* cas_counter) {
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(counter, 1);
  atomicMax(maximum, id);
  unsigned old = *cas_counter, assumed;
  do {
    assumed = old;
    old = atomicCAS(cas_counter, assumed, assumed + 1);
  } while (old != assumed);
}

inline std::vector<long> atomics(int blocks, int threads) {
  int counter = 0, maximum = -1;
  unsigned cas_counter = 0;
  DOMINO_LAUNCH(atomics_kernel, dim3(blocks), dim3(threads), 0, nullptr, &counter, &maximum, &cas_counter);
  return {counter, maximum, static_cast<long>(cas_counter)};
}

// Dynamic shared memory is poisoned before each block: a kernel that reads what it never
// wrote gets NaN.
__global__ void read_unwritten_shared_kernel(float* out) {
  DOMINO_DYNAMIC_SHARED(float, buf);
  if (threadIdx.x == 0) out[blockIdx.x] = buf[1];
}

inline std::vector<float> read_unwritten_shared(int blocks) {
  std::vector<float> out(blocks, 0.0f);
  DOMINO_LAUNCH(read_unwritten_shared_kernel, dim3(blocks), dim3(32), 64, nullptr, out.data());
  return out;
}

// Thread 0 waits in a shuffle for its warp while the others wait at __syncthreads for
// thread 0: neither barrier can complete (undefined behaviour on a GPU, where it may hang).
__global__ void divergent_barriers_kernel(int* out) {
  if (threadIdx.x == 0)
    out[0] = __shfl_sync(0xffffffffu, 1, 0);
  else
    __syncthreads();
}

inline void divergent_barriers() {
  int out = 0;
  DOMINO_LAUNCH(divergent_barriers_kernel, dim3(1), dim3(32), 0, nullptr, &out);
}

// An empty kernel launched with the given shape; returns the launch error code.
__global__ void empty_kernel() {}

inline int launch_status(unsigned blocks, unsigned threads, size_t smem) {
  return static_cast<int>(DOMINO_LAUNCH(empty_kernel, dim3(blocks), dim3(threads), smem, nullptr));
}

}  // namespace domino::simt_selftest
