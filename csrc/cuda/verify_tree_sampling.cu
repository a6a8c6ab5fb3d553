// CUDA kernel of verify_tree_sampling: lossless verification of a sampled draft tree with
// the draft's probabilities (recursive rejection sampling). Same semantics as the CPU
// kernel (csrc/cpu/verify_tree_sampling.cpp, whose header states them), one block per
// request: at each node the block copies the node's target and draft rows into the
// request's float64 workspace rows p and q; each child in sibling order is accepted when
// q(x) > 0 and coin * q(x)/qn < p(x)/pn (every thread evaluates the same test on the same values, so
// control flow stays uniform); a rejection rewrites p in place as max(0, p/pn - q/qn) when
// that has positive total (one pass for the total, one to write), then zeroes q(x) and
// re-sums q. The last token is drawn from max(0, p) by row_sampler.cuh's inverse CDF.
//
// Rounding: the totals pn, qn and the final CDF are float64 block reductions (per-thread
// chunks, then across the block), not the CPU's index-order sums, so they can differ in the
// last bits: a decision changes only when a coin lands within ~1e-16 (relative) of an
// acceptance threshold or a CDF step. A chain (one child per node) rejects nothing before
// the last test, so its accept tests use the rows as given, exactly as verify_sampling.
//
// Bytes per request: per visited node the two rows (2 * 4 * V read, 2 * 8 * V written to
// the workspace), per rejected sibling ~5 passes over the two float64 rows (40 * V bytes,
// L2-resident: 2.4 MB at V = 151936); the walk and the passes are serial per request, so
// one SM's L2 rate (~100-200 GB/s) bounds a request: ~10 us per rejection at V = 151936.
// Requests run on separate SMs.
//
// Bad index values (which the CPU kernel rejects with an error) never become addresses
// (tree_common.cuh): out-of-range links read as -1, a slot outside predicts is never
// written, sibling walks are bounded by N, and a child whose candidate token is outside
// [0, V) is skipped (neither accepted nor changing p and q).
#include "cuda/row_sampler.cuh"
#include "cuda/tree_common.cuh"
#include "cuda/verify_tree_sampling.cuh"

namespace domino::cuda {
namespace {

__global__ void __launch_bounds__(kSamplerThreads) verify_tree_sampling_kernel(VerifyTreeSamplingArgs a) {
  __shared__ RowScratch sh;
  const int64_t b = blockIdx.x, n = a.n, V = a.V;
  const int64_t* ridx = a.retrive_index + b * n;
  const int64_t* cand = a.candidates + b * n;
  const int64_t* nt = a.retrive_next_token + b * n;
  const int64_t* ns = a.retrive_next_sibling + b * n;
  const double* coins = a.uniform_samples + b * n;
  int32_t* acc_index = a.accept_index + b * a.steps;
  double* p = a.workspace + 2 * b * V;
  double* q = p + V;
  tree_clear_predicts(a.predicts, ridx, n, a.slot_limit);
  __syncthreads();

  int64_t node = 0, num = 0;
  if (threadIdx.x == 0) acc_index[0] = static_cast<int32_t>(ridx[0]);
  for (;;) {
    const float* prow = a.target_probs + (b * n + node) * V;
    const float* qrow = a.draft_probs + (b * n + node) * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      p[j] = prow[j];
      q[j] = qrow[j];
    }
    __syncthreads();
    double pn = 1.0, qn = 1.0;
    int64_t child = num + 1 < a.steps ? tree_link(nt, node, n) : -1;
    for (int64_t tried = 0; child != -1; child = ++tried < n ? tree_link(ns, child, n) : -1) {
      const int64_t x = cand[child];
      if (x < 0 || x >= V) continue;
      const double qx = qn > 0.0 ? q[x] / qn : 0.0;
      if (qx > 0.0 && coins[child] * qx < p[x] / pn) break;  // accepted (q = 0: could not have been drawn)
      // Rejected: p <- max(0, p/pn - q/qn) unless that is all zero; q <- q without x.
      auto residual = [&](int64_t j) {
        const double d = p[j] / pn - (qn > 0.0 ? q[j] / qn : 0.0);
        return d > 0.0 ? d : 0.0;  // NaN -> 0
      };
      double part = 0.0;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) part += residual(j);
      const double total = block_sum(part, sh.dsum);  // ends with a barrier: p is read by all
      if (total > 0.0) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) p[j] = residual(j);  // element-wise in place
        pn = total;
      }
      __syncthreads();  // p[x] of the old draft read by every thread before q[x] changes
      if (threadIdx.x == 0) q[x] = 0.0;
      __syncthreads();
      part = 0.0;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) part += q[j];
      qn = block_sum(part, sh.dsum);
    }
    if (child == -1) break;
    if (threadIdx.x == 0) {
      const int64_t r = ridx[node];
      if (tree_slot_ok(r, a.slot_limit)) a.predicts[r] = static_cast<int32_t>(cand[child]);
      acc_index[num + 1] = static_cast<int32_t>(ridx[child]);
    }
    node = child;
    ++num;
    __syncthreads();  // every thread is done with p and q before the next node's copy
  }

  auto weight = [&](int64_t j, long long&) -> double { return p[j] > 0.0 ? p[j] : 0.0; };
  const Pick pick = inverse_cdf_pick(weight, V, a.final_uniforms[b], 0, sh);
  if (threadIdx.x == 0) {
    const int64_t r = ridx[node];
    if (tree_slot_ok(r, a.slot_limit)) a.predicts[r] = static_cast<int32_t>(pick.token >= 0 ? pick.token : 0);
    a.accept_token_num[b] = static_cast<int32_t>(num);
  }
  tree_pad_accept_index(acc_index, num, a.steps);
}

}  // namespace

cudaError_t launch_verify_tree_sampling(const VerifyTreeSamplingArgs& args, cudaStream_t stream) {
  return DOMINO_LAUNCH(verify_tree_sampling_kernel, dim3(static_cast<unsigned>(args.bs)), dim3(kSamplerThreads), 0,
                       stream, args);
}

}  // namespace domino::cuda
