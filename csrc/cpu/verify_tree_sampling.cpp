// CPU kernel of verify_tree_sampling: lossless verification of a sampled draft tree that
// uses the draft's probabilities (recursive rejection sampling, Recursive Speculative
// Decoding, arXiv 2402.14160), in sgl-kernel's tree layout.
//
// The children of a node u were drawn from the draft distribution q_u without replacement,
// in sibling order. Per request, from the root: the children of the current node are tried
// in sibling order against a target p and a draft q that start as p_u and q_u; child x is
// accepted when q(x) > 0 and coin * q(x) < p(x), coin = uniform_samples[b, child]
// (probability min(1, p(x)/q(x)); a child of draft probability 0 could not have been drawn
// and is rejected, a no-op), and the walk moves to it. A rejection updates both: the target becomes
// the residual normalize(max(0, p - q)) (unchanged if that is all zero: the rejection then
// had probability zero) and the draft loses x (the next sibling was drawn from q without x).
// When every child is rejected the last token is drawn from the current target; when the
// walk reaches a leaf or num_spec_step - 1 accepted tokens, from p at that node. The draw
// is the first token whose float64 running sum (index order) exceeds
// uniform_samples_for_final_sampling[b] times the total, else the last positive token, else
// (no positive mass: not a distribution) token 0, as verify_sampling.
// Every emitted token is distributed exactly as the target's. With one child per node the
// arithmetic is verify_sampling's, operation for operation: the same accept test (p and q
// used as given at the first sibling), the same residual weights and the same draw, so a
// chain gives exactly verify_sampling's tokens for the same uniforms (for drafts drawn from
// q: verify_sampling would accept a q(x) = 0 draft whenever p(x) > 0).
//
// Bytes moved per request: the target and draft rows of every visited node (2 * 4 * V
// bytes each), plus per rejected sibling three passes over two float64 scratch rows of V
// (the residual and its total, the draft without x and its total): 48 * V bytes, L1/L2
// resident at V = 32k on one core. What limits it is the dependent float64 adds of the
// totals (kept sequential: the reference's torch.cumsum gives bit-identical sums), ~V
// cycles per rejection. Requests run in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "cpu/row_sampler.h"
#include "cpu/tree_common.h"
#include "tree_ops.h"

namespace domino::cpu {
namespace {

inline double positive(double d) { return d > 0.0 ? d : 0.0; }  // NaN -> 0

// The current target p/pn and draft q/qn a node's next child is verified against.
struct Sibling {
  std::vector<double> p, q;
  double pn = 1.0, qn = 1.0;

  void start(const float* prow, const float* qrow, int64_t vocab) {
    p.assign(prow, prow + vocab);
    q.assign(qrow, qrow + vocab);
    pn = qn = 1.0;
  }
  // A child the draft gives no mass could not have been drawn: rejected (a no-op, the
  // residual of a zero draft is the target itself).
  bool accepts(int64_t x, double coin) const {
    const double qx = qn > 0.0 ? q[x] / qn : 0.0;
    return qx > 0.0 && coin * qx < p[x] / pn;
  }
  // After rejecting x: p <- max(0, p/pn - q/qn) unless that is all zero; q <- q without x.
  void reject(int64_t x, std::vector<double>& scratch) {
    const int64_t vocab = static_cast<int64_t>(p.size());
    double total = 0.0;
    for (int64_t t = 0; t < vocab; ++t) {
      scratch[t] = positive(p[t] / pn - (qn > 0.0 ? q[t] / qn : 0.0));
      total += scratch[t];
    }
    if (total > 0.0) {
      p.swap(scratch);
      pn = total;
    }
    q[x] = 0.0;
    qn = 0.0;
    for (int64_t t = 0; t < vocab; ++t) qn += q[t];
  }
};

// The final draw from max(0, p) (p clamped in place: the walk is over), by row_sampler.h's
// inverse CDF; -1 when nothing is positive.
int64_t final_draw(std::vector<double>& p, double coin) {
  double total = 0.0;
  for (double& w : p) total += (w = positive(w));
  return inverse_cdf(p.data(), static_cast<int64_t>(p.size()), total, coin);
}

}  // namespace

void verify_tree_sampling_cpu(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
                              const at::Tensor& candidates, const at::Tensor& retrive_index,
                              const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                              const at::Tensor& uniform_samples,
                              const at::Tensor& uniform_samples_for_final_sampling,
                              const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  check_verify_tree_sampling_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                  retrive_next_token, retrive_next_sibling, uniform_samples,
                                  uniform_samples_for_final_sampling, target_probs, draft_probs);
  const TreeView tree = tree_view(candidates, retrive_index, retrive_next_token, retrive_next_sibling, accept_index);
  const auto [bs, n, steps, cand, ridx, next_token, next_sibling] = tree;
  const auto [p_all, q_all, vocab] = tree_probs(target_probs, &draft_probs);
  if (bs == 0) return;
  const double* coins = uniform_samples.const_data_ptr<double>();
  const double* final_coins = uniform_samples_for_final_sampling.const_data_ptr<double>();

  check_tree_links(ridx, next_token, next_sibling, bs, n, predicts.numel(), "predicts.numel()");
  for (int64_t b = 0; b < bs; ++b)  // every draft token, read or not (the root's is not a draft)
    for (int64_t u = 1; u < n; ++u)
      TORCH_CHECK(cand[b * n + u] >= 0 && cand[b * n + u] < vocab, "candidates must be token ids in [0, ", vocab,
                  "), got ", cand[b * n + u], " at node ", u, " of request ", b);

  // Pass 1 (parallel, nothing written): path, emitted tokens and accepted count per request.
  std::vector<int64_t> path(bs * steps), tokens(bs * steps), accepted(bs);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (4 * vocab + n));
  at::parallel_for(0, bs, grain, [&](int64_t b0, int64_t b1) {
    Sibling s;
    std::vector<double> scratch(vocab);
    for (int64_t b = b0; b < b1; ++b) {
      const auto [nt, ns, pth, tok] = request_walk(tree, b, path, tokens);
      int64_t num = 0, node = 0;
      for (;;) {
        s.start(p_all + (b * n + node) * vocab, q_all + (b * n + node) * vocab, vocab);
        int64_t child = num + 1 < steps ? nt[node] : -1;
        while (child != -1) {
          const int64_t x = cand[b * n + child];
          if (s.accepts(x, coins[b * n + child])) break;
          s.reject(x, scratch);
          child = ns[child];
        }
        if (child == -1) break;
        tok[num] = cand[b * n + child];
        pth[++num] = node = child;
      }
      accepted[b] = num;
      const int64_t last = final_draw(s.p, final_coins[b]);
      tok[num] = last >= 0 ? last : 0;  // no positive mass: token 0, as verify_sampling
    }
  });

  write_tree_paths(predicts, accept_index, accept_token_num, tree, path, tokens, accepted);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("verify_tree_sampling", &domino::cpu::verify_tree_sampling_cpu); }
