// CUDA kernel of tree_speculative_sampling_target_only (sgl-kernel-compatible): sampled
// verification of a draft tree against the target's probabilities only. Same results as
// the CPU kernel (csrc/cpu/tree_speculative_sampling_target_only.cpp, whose header states
// the semantics) on valid input, up to the float64 summation order of the final draw
// (the CPU sums in index order, this kernel per thread chunk and then across the block;
// the CDF differs in the last bits, which changes a token only if the uniform lands within
// ~1e-16 of a CDF step).
//
// Bytes per request: the walk reads one float per child tried (at most N) plus the links
// and candidates of the visited nodes; the final draw reads one vocab row of target_probs
// (and of draft_probs unless None) in up to three passes (the chunk sums, the walk of the
// chunk holding the target, and the last positive weight after rounding): 2 * 4 * V bytes
// per request in practice (twice that with draft_probs), 256 KB at V = 32k, the second pass
// from L1/L2. One block per request, so at small batch one SM's load rate bounds the draw
// (~100 GB/s: a few microseconds at V = 32k) and the walk, lane 0 alone, costs one L2 round
// trip per child tried; requests run on separate SMs.
//
// Bad index values (which the CPU kernel rejects with an error) never become addresses
// (tree_common.cuh): out-of-range links read as -1, a node whose retrive_index slot is out
// of range is never written through, a sibling list longer than N counts as exhausted, and
// a child whose candidate token is outside [0, V) is never accepted nor masked from the
// final draw. retrive_index is assumed injective, as in verify_tree_greedy.
#include "cuda/row_sampler.cuh"
#include "cuda/tree_common.cuh"
#include "cuda/tree_speculative_sampling_target_only.cuh"

namespace domino::cuda {
namespace {

__global__ void __launch_bounds__(kSamplerThreads) tree_sampling_kernel(TreeSamplingArgs a) {
  DOMINO_DYNAMIC_SHARED(int32_t, rejected);  // [n]: tokens of the children rejected at the last node
  __shared__ RowScratch sh;
  __shared__ int64_t node_shared, num_shared, rejected_count;
  const int64_t b = blockIdx.x, n = a.n, V = a.V;
  const int64_t* ridx = a.retrive_index + b * n;
  const int64_t* cand = a.candidates + b * n;
  const int64_t* nt = a.retrive_next_token + b * n;
  const int64_t* ns = a.retrive_next_sibling + b * n;
  int32_t* acc_index = a.accept_index + b * a.steps;
  const float acc_div = fmaxf(a.threshold_acc, 1e-9f);  // sgl-kernel's cap
  tree_clear_predicts(a.predicts, ridx, n, a.slot_limit);
  __syncthreads();

  if (threadIdx.x == 0) {
    int64_t node = 0, num = 0, count = 0;
    acc_index[0] = static_cast<int32_t>(ridx[0]);
    for (int64_t level = 1; level < a.steps; ++level) {
      const float* prow = a.target_probs + (b * n + node) * V;
      const float coin = a.uniform_samples[b * n + node];
      float acc = 0.0f;
      bool accepted = false;
      int64_t child = tree_link(nt, node, n);
      count = 0;
      for (int64_t tried = 0; child != -1;) {
        const int64_t t = cand[child];
        if (t >= 0 && t < V) {
          const float pt = prow[t];
          acc += pt;
          if (coin <= acc / acc_div || pt >= a.threshold_single) {
            accepted = true;
            break;
          }
          rejected[count++] = static_cast<int32_t>(t);
        }
        child = ++tried < n ? tree_link(ns, child, n) : -1;
      }
      if (!accepted) break;
      count = 0;
      const int64_t r = ridx[node];
      if (tree_slot_ok(r, a.slot_limit)) a.predicts[r] = static_cast<int32_t>(cand[child]);
      node = child;
      acc_index[++num] = static_cast<int32_t>(ridx[node]);
    }
    node_shared = node;
    num_shared = num;
    rejected_count = count;
  }
  __syncthreads();
  const int64_t node = node_shared, num = num_shared, count = rejected_count;

  // The final draw from the residual at `node`, the rejected children's tokens zeroed.
  const float* prow = a.target_probs + (b * n + node) * V;
  const float* qrow = (a.draft_probs != nullptr && num != a.steps - 1) ? a.draft_probs + (b * n + node) * V
                                                                       : nullptr;
  auto weight = [&](int64_t j, long long&) -> double {
    for (int64_t k = 0; k < count; ++k) {
      if (rejected[k] == j) return 0.0;
    }
    return static_cast<double>(fmaxf(qrow == nullptr ? prow[j] : prow[j] - qrow[j], 0.0f));  // NaN -> 0
  };
  const Pick pick = inverse_cdf_pick(weight, V, static_cast<double>(a.final_uniforms[b]), 0, sh);
  if (threadIdx.x == 0) {
    const int64_t r = ridx[node];
    if (tree_slot_ok(r, a.slot_limit)) a.predicts[r] = static_cast<int32_t>(pick.token >= 0 ? pick.token : V - 1);
    a.accept_token_num[b] = static_cast<int32_t>(num);
  }
  tree_pad_accept_index(acc_index, num, a.steps);
}

}  // namespace

cudaError_t launch_tree_speculative_sampling_target_only(const TreeSamplingArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.bs)), block(kSamplerThreads);
  const size_t smem = static_cast<size_t>(args.n) * sizeof(int32_t);
  return DOMINO_LAUNCH(tree_sampling_kernel, grid, block, smem, stream, args);
}

}  // namespace domino::cuda
