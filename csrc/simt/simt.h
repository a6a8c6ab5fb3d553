// Host SIMT emulation of the CUDA execution model: TEST INFRASTRUCTURE ONLY, never a
// performance path.
//
// It lets the kernels in csrc/cuda/ be compiled as ordinary host C++ (include
// cuda/portable.cuh with DOMINO_SIMT defined) and executed on a machine without a GPU:
//
//   - every CUDA thread of a block is a fiber on the launching OS thread (simt.cpp), run
//     from barrier to barrier; blocks of the grid run one after another, so a `__shared__`
//     variable (a function-local static here) is private to the running block;
//   - __syncthreads() is a barrier over the block's live threads (a thread that returns
//     leaves the barrier, as an exited thread does on the GPU);
//   - warp shuffles and votes exchange values through one slot per lane, fenced by a
//     barrier over the warp's live lanes, with the CUDA semantics for out-of-range
//     sources (the caller keeps its own value) and for width < 32;
//   - atomics are std::atomic_ref operations, __threadfence is a seq_cst fence;
//   - launch dimensions are honoured, blocks over 1024 threads or dynamic shared memory
//     over 48 KiB are rejected as the GPU would (cudaErrorInvalidConfiguration), and the
//     dynamic shared memory is poisoned (0xFF bytes: NaN floats, -1 ints) before each
//     block so a kernel that reads what it never wrote sees garbage.
//
// Limits: all live lanes of a warp must reach a shuffle or vote together (the kernels
// here only use full-warp masks), a block must not depend on another block running
// concurrently (no grid-wide barriers), and a thread must not spin on a value another
// thread of its block writes without a barrier between them (it would never yield).
// Threads of a block stopped at barriers the others never reach raise an error, not a
// hang. A missing barrier shows up as a wrong result (the scheduler alternates the
// threads' order between barriers and between even and odd blocks, so a thread reads its
// partners' slots before they are written) or, deterministically, as a ThreadSanitizer
// report (tests/test_simt_emulator.py builds a TSan binary for that).
#pragma once

#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

// ---- CUDA runtime vocabulary -----------------------------------------------------------
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9, cudaErrorInvalidValue = 1 };
using cudaStream_t = void*;

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t err);

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time, so one static per kernel instantiation is one block's shared
// memory.
#define __shared__ static

namespace simt {

// Runs `block_body` for every block of `grid` with `block` threads each. Returns the launch
// error (also reported by cudaGetLastError, as after a real launch).
cudaError_t launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   const std::function<void()>& block_body);

void* dynamic_shared_memory();
void sync_block();
void sync_warp();
// Exchanges `bits` (8 bytes) with the warp: writes this lane's value, returns lane `src`'s.
uint64_t warp_exchange(uint64_t bits, int src_lane);
int lane_id();

template <typename T>
T shuffle(T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace simt

inline void __syncthreads() { simt::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { simt::sync_warp(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  const int lane = simt::lane_id();
  return simt::shuffle(v, (lane / width) * width + (src_lane % width));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = simt::lane_id();
  const int src = lane + static_cast<int>(delta);
  return simt::shuffle(v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = simt::lane_id();
  const int src = lane - static_cast<int>(delta);
  return simt::shuffle(v, src >= (lane / width) * width ? src : lane);
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const int lane = simt::lane_id();
  const int src = lane ^ lane_mask;
  return simt::shuffle(v, src / width == lane / width ? src : lane);
}
unsigned __ballot_sync(unsigned mask, int predicate);
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
int __all_sync(unsigned mask, int predicate);

template <typename T>
T atomicAdd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val);
}
template <typename T>
T atomicExch(T* address, T val) {
  return std::atomic_ref<T>(*address).exchange(val);
}
template <typename T>
T atomicCAS(T* address, T compare, T val) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, val);
  return compare;  // the old value, whether or not the swap happened
}
template <typename T>
T atomicMax(T* address, T val) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, T val) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old > val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}

// ---- device intrinsics, exact host equivalents -----------------------------------------
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }

// CUDA's global min/max overloads.
template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }

// ---- bfloat16 (layout of cuda_bf16.h's __nv_bfloat16: the top 16 bits of a float) ------
struct __nv_bfloat16 {
  uint16_t bits;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16);
}
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}
