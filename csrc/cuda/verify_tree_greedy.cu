// CUDA kernel of verify_tree_greedy (sgl-kernel-compatible): greedy verification of a draft
// tree in left-child / right-sibling form. Same results as the CPU kernel
// (csrc/cpu/verify_tree_greedy.cpp, whose header states the semantics) on valid input.
//
// Bytes per request: reads the links, candidates and target tokens of the nodes the walk
// visits (at most N of each, 8 B) and N retrive_index entries; writes N + num_spec_step + 1
// int32. A few hundred bytes: what limits it is the chain of dependent loads of the walk
// (one L2 round trip per node tried, ~N of them) plus the launch, not bandwidth. One block
// (a warp) per request: the warp clears the request's predicts slots, then lane 0 walks
// and writes the accepted path (after a barrier, so the clear never lands on it), then the
// warp pads accept_index with -1.
//
// Bad index values (which the CPU kernel rejects with an error) never become addresses
// (tree_common.cuh): out-of-range links read as -1, a node whose retrive_index slot is out
// of range ends the walk and is never written through, and a sibling list longer than N
// (a cycle) counts as exhausted. retrive_index is assumed injective, as every caller builds
// it (b * N + u); predicts slots named twice get an unspecified one of their values.
#include "cuda/tree_common.cuh"
#include "cuda/verify_tree_greedy.cuh"

namespace domino::cuda {
namespace {

__global__ void __launch_bounds__(kTreeThreads)
verify_tree_greedy_kernel(int32_t* __restrict__ predicts, int32_t* __restrict__ accept_index,
                          int32_t* __restrict__ accept_token_num, const int64_t* __restrict__ candidates,
                          const int64_t* __restrict__ retrive_index, const int64_t* __restrict__ next_token,
                          const int64_t* __restrict__ next_sibling, const int64_t* __restrict__ target,
                          int64_t n, int64_t steps, int64_t limit) {
  __shared__ int64_t num_shared;
  const int64_t b = blockIdx.x;
  const int64_t* ridx = retrive_index + b * n;
  const int64_t* cand = candidates + b * n;
  const int64_t* nt = next_token + b * n;
  const int64_t* ns = next_sibling + b * n;
  int32_t* acc = accept_index + b * steps;
  tree_clear_predicts(predicts, ridx, n, limit);
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t node = 0, num = 0;
    acc[0] = static_cast<int32_t>(ridx[0]);
    for (int64_t level = 1; level < steps; ++level) {
      const int64_t r = ridx[node];
      if (!tree_slot_ok(r, limit)) break;
      const int64_t want = target[r];
      int64_t child = tree_link(nt, node, n);
      for (int64_t tried = 0; child != -1 && cand[child] != want;) {
        child = ++tried < n ? tree_link(ns, child, n) : -1;
      }
      if (child == -1) break;
      predicts[r] = static_cast<int32_t>(cand[child]);
      node = child;
      acc[++num] = static_cast<int32_t>(ridx[node]);
    }
    const int64_t last = ridx[node];
    if (tree_slot_ok(last, limit)) predicts[last] = static_cast<int32_t>(target[last]);
    accept_token_num[b] = static_cast<int32_t>(num);
    num_shared = num;
  }
  __syncthreads();
  tree_pad_accept_index(acc, num_shared, steps);
}

}  // namespace

cudaError_t launch_verify_tree_greedy(int32_t* predicts, int32_t* accept_index, int32_t* accept_token_num,
                                      const int64_t* candidates, const int64_t* retrive_index,
                                      const int64_t* retrive_next_token, const int64_t* retrive_next_sibling,
                                      const int64_t* target_predict, int64_t bs, int64_t n, int64_t steps,
                                      int64_t slot_limit, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(bs)), block(kTreeThreads);
  return DOMINO_LAUNCH(verify_tree_greedy_kernel, grid, block, 0, stream, predicts, accept_index,
                       accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                       target_predict, n, steps, slot_limit);
}

}  // namespace domino::cuda
