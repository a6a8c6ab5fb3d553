// What every kernel in csrc/cuda/ includes instead of the CUDA headers, so that one kernel
// source builds two ways: with nvcc for the GPU, and (DOMINO_SIMT defined) as host C++
// for the SIMT emulator in csrc/simt/, which is how CI executes these kernels without a
// GPU. Kernel bodies keep to what both can run: warp shuffles and votes, shared memory,
// barriers, atomics. Launches go through DOMINO_LAUNCH and dynamic shared memory through
// DOMINO_DYNAMIC_SHARED, the two places where the syntax differs.
#pragma once

#ifdef DOMINO_SIMT
#include "simt/simt.h"
#define DOMINO_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream), ::simt::launch((grid), (block), (smem), [&] { kernel(__VA_ARGS__); }))
#define DOMINO_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::simt::dynamic_shared_memory())
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define DOMINO_LAUNCH(kernel, grid, block, smem, stream, ...) \
  (kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__), cudaGetLastError())
#define DOMINO_DYNAMIC_SHARED(T, name) \
  extern __shared__ __align__(16) unsigned char name##_raw[];  \
  T* name = reinterpret_cast<T*>(name##_raw)
#endif

#include <climits>
#include <cstdint>
