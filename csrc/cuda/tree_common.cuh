// Device helpers shared by the CUDA kernels of the sgl-kernel-compatible tree ops
// (build_tree_kernel_efficient.cu, verify_tree_greedy.cu,
// tree_speculative_sampling_target_only.cu, verify_tree_sampling.cu): index validation, the predicts clear and the
// accept_index padding. Plain CUDA (no torch headers), also built for the SIMT emulator.
//
// A GPU kernel cannot raise. Where the CPU kernels (csrc/cpu/) raise on a bad index value,
// these kernels never use it as an address: an out-of-range link reads as -1 (no child /
// no sibling), an out-of-range retrive_index slot is neither read nor written (the walk
// stops at that node), and every walk is bounded by the node count, so a cycle ends it.
// Such calls produce unspecified (but in-bounds) results; the checked Python wrappers
// reject them on CPU tensors before any kernel runs.
#pragma once

#include "cuda/common.cuh"

namespace domino::cuda {

// Threads per block of the index-chasing kernels (build_tree_kernel_efficient,
// verify_tree_greedy): one warp per request; the work is a few hundred dependent loads.
constexpr int kTreeThreads = kWarp;

// sgl-kernel's TreeMaskMode (tree_ops.h's enum, restated here without torch headers).
constexpr int64_t kTreeFullMask = 0, kTreeQlenOnly = 1, kTreeQlenOnlyBitpacking = 2;

// A link (retrive_next_token / retrive_next_sibling value): a node in [0, n), else -1.
__device__ __forceinline__ int64_t tree_link(const int64_t* links, int64_t node, int64_t n) {
  const int64_t v = links[node];
  return v >= 0 && v < n ? v : -1;
}

__device__ __forceinline__ bool tree_slot_ok(int64_t slot, int64_t limit) { return slot >= 0 && slot < limit; }

// predicts[retrive_index[u]] = -1 for every node u of this request whose slot is in range.
// The caller syncs before writing the accepted path over it.
__device__ __forceinline__ void tree_clear_predicts(int32_t* predicts, const int64_t* ridx, int64_t n,
                                                    int64_t limit) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t r = ridx[i];
    if (tree_slot_ok(r, limit)) predicts[r] = -1;
  }
}

// accept_index[num + 1 : steps] = -1 (num broadcast by the caller through shared memory).
__device__ __forceinline__ void tree_pad_accept_index(int32_t* accept_row, int64_t num, int64_t steps) {
  for (int64_t j = num + 1 + threadIdx.x; j < steps; j += blockDim.x) accept_row[j] = -1;
}

}  // namespace domino::cuda
