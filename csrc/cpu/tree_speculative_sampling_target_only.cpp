// CPU kernel of tree_speculative_sampling_target_only (sgl-kernel-compatible): sampled
// verification of a draft tree against the target's probabilities only.
//
// Per request b, walking from the root as verify_tree_greedy does: at node u one coin
// c = uniform_samples[b, u] is used for all of u's children; they are tried in sibling
// order, accumulating their target probabilities acc += p_u(token) (float32, as sgl-kernel),
// and a child is accepted when c <= acc / max(threshold_acc, 1e-9) or p_u(token) >=
// threshold_single; then the walk moves to it. When no child is accepted (or the walk has
// accepted num_spec_step - 1 tokens) the last token is drawn from the residual at the last
// accepted node u: r = max(p_u - q_u, 0) with q_u = draft_probs[b, u] (zeros when None),
// except that the children rejected at u get r = 0, and r = max(p_u, 0) after a full
// acceptance. The draw is the first token whose cumulative residual (float64) exceeds
// uniform_samples_for_final_sampling[b] * sum(r), else the last token with r > 0, else
// vocab_size - 1. With both thresholds 1 and distinct sibling tokens this is exactly
// sampling from the target: child k is taken with probability p_u(token_k), and the
// residual renormalises p_u without them.
//
// Differences from sgl-kernel, none of which change a result: draft_probs may be None
// (newer sgl-kernel releases dropped the argument); draft_probs is never written (sgl-kernel
// scribbles the rejected children's target probabilities into it although its schema marks
// it read-only); accept_index past the accepted nodes and predicts at nodes off the
// accepted path are written -1 (sgl-kernel leaves them as the caller filled them);
// `deterministic` is accepted and ignored (this kernel is always deterministic).
//
// Bytes moved per request: the walk reads one float per child tried (at most N) plus the
// links and candidates of the visited nodes; the final draw reads one vocab row of
// target_probs (and of draft_probs unless None) in two passes (the total, then the scan up
// to the drawn token): at most 2 * 4 * V bytes (twice that with draft_probs), 256 KB at
// V = 32k, L2-resident between the passes. What limits it is not bandwidth but the
// float64 running sum, one dependent add per token (kept sequential so that the reference's
// torch.cumsum gives bit-identical CDFs): ~150 us per request at V = 32k on a 2-core EPYC VM
// (benchmarks/bench_tree.py). Requests run in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/tree_common.h"
#include "tree_ops.h"

namespace domino::cpu {
namespace {

// Residual weight of token i (the rejected children are zeroed by the caller).
inline float residual(const float* p, const float* q, int64_t i) {
  return std::fmax(q == nullptr ? p[i] : p[i] - q[i], 0.0f);  // fmaxf: NaN -> 0, as CUDA's max
}

}  // namespace

void tree_speculative_sampling_target_only_cpu(
    at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index,
    const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs,
    double threshold_single, double threshold_acc, bool deterministic) {
  (void)deterministic;
  check_tree_sampling_args(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                           draft_probs, threshold_single, threshold_acc);
  const TreeView tree = tree_view(candidates, retrive_index, retrive_next_token, retrive_next_sibling, accept_index);
  const auto [bs, n, steps, cand, ridx, next_token, next_sibling] = tree;
  const auto [p_all, q_all, vocab] = tree_probs(target_probs, draft_probs.has_value() ? &*draft_probs : nullptr);
  if (bs == 0) return;
  const float* coins = uniform_samples.const_data_ptr<float>();
  const float* final_coins = uniform_samples_for_final_sampling.const_data_ptr<float>();
  const float single = static_cast<float>(threshold_single);
  const float acc_div = std::max(static_cast<float>(threshold_acc), 1e-9f);  // sgl-kernel's cap

  check_tree_links(ridx, next_token, next_sibling, bs, n, predicts.numel(), "predicts.numel()");

  // Pass 1 (parallel, nothing written): path, path tokens and the final token per request.
  std::vector<int64_t> path(bs * steps), tokens(bs * steps), accepted(bs);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (2 * vocab + n));
  at::parallel_for(0, bs, grain, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> rejected;
    rejected.reserve(n);
    for (int64_t b = b0; b < b1; ++b) {
      const auto [nt, ns, p, tok] = request_walk(tree, b, path, tokens);
      int64_t num = 0, node = 0;
      rejected.clear();
      for (int64_t level = 1; level < steps; ++level) {
        const float* prow = p_all + (b * n + node) * vocab;
        const float coin = coins[b * n + node];
        float acc = 0.0f;
        int64_t child = nt[node];
        while (child != -1) {
          const int64_t t = cand[b * n + child];
          TORCH_CHECK(t >= 0 && t < vocab, "candidates must be token ids in [0, ", vocab, "), got ", t,
                      " at node ", child, " of request ", b);
          const float pt = prow[t];
          acc += pt;
          if (coin <= acc / acc_div || pt >= single) break;
          rejected.push_back(t);
          child = ns[child];
        }
        if (child == -1) break;
        rejected.clear();
        tok[num] = cand[b * n + child];
        p[++num] = node = child;
      }
      accepted[b] = num;

      // The final draw from the residual at `node`.
      const float* prow = p_all + (b * n + node) * vocab;
      const float* qrow = (q_all != nullptr && num != steps - 1) ? q_all + (b * n + node) * vocab : nullptr;
      // The rejected children's tokens, ascending, are skipped by a merge walk over the row.
      std::sort(rejected.begin(), rejected.end());
      auto scan = [&](auto&& visit) {
        size_t k = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          while (k < rejected.size() && rejected[k] < i) ++k;
          const float wi = (k < rejected.size() && rejected[k] == i) ? 0.0f : residual(prow, qrow, i);
          if (!visit(i, wi)) return;
        }
      };
      double total = 0.0;
      scan([&](int64_t, float wi) { total += wi; return true; });
      const double u = static_cast<double>(final_coins[b]) * total;
      int64_t chosen = -1, last_valid = -1;
      double cdf = 0.0;
      scan([&](int64_t i, float wi) {
        cdf += wi;
        if (wi > 0.0f) {
          last_valid = i;
          if (cdf > u) {
            chosen = i;
            return false;
          }
        }
        return true;
      });
      tok[num] = chosen >= 0 ? chosen : (last_valid >= 0 ? last_valid : vocab - 1);
    }
  });

  write_tree_paths(predicts, accept_index, accept_token_num, tree, path, tokens, accepted);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("tree_speculative_sampling_target_only", &domino::cpu::tree_speculative_sampling_target_only_cpu); }
