// CPU kernel of verify_tree_greedy (sgl-kernel-compatible): greedy verification of a draft
// tree in left-child / right-sibling form.
//
// Per request b, from the root (node 0): at each of at most num_spec_step - 1 levels, the
// first child (in sibling order) whose candidate token equals the target's argmax at the
// current node is accepted; predicts[r(u)] gets that token for each accepted parent u and
// the target's token at the last accepted node (the bonus), where r = retrive_index and
// target_predict is addressed by r too (as a flat [bs * N] array), candidates and the links
// by node. accept_index[b] lists r of the accepted nodes, root first; accept_token_num[b]
// counts them without the root. Unlike sgl-kernel (which leaves them as the caller filled
// them, SGLang fills -1), the rest of accept_index[b] and predicts[r(u)] for every node u
// off the accepted path are written -1, so every output element this request owns is
// written.
//
// Bytes moved: reads the links, candidates and target tokens of the nodes visited (at most
// N of each, 8 B) and writes N + num_spec_step + 1 int32 per request: a few hundred bytes.
// Nothing here is bandwidth- or compute-bound; the cost is the dependent loads of the walk
// plus the call overhead, so requests run serially.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/tree_common.h"
#include "tree_ops.h"

namespace domino::cpu {

void verify_tree_greedy_cpu(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
                            const at::Tensor& candidates, const at::Tensor& retrive_index,
                            const at::Tensor& retrive_next_token,
                            const at::Tensor& retrive_next_sibling, const at::Tensor& target_predict) {
  check_verify_tree_greedy_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, target_predict);
  const TreeView tree = tree_view(candidates, retrive_index, retrive_next_token, retrive_next_sibling, accept_index);
  const auto [bs, n, steps, cand, ridx, next_token, next_sibling] = tree;
  if (bs == 0) return;
  const int64_t* target = target_predict.const_data_ptr<int64_t>();

  // retrive_index addresses predicts and (flat) target_predict; the links address nodes.
  check_tree_links(ridx, next_token, next_sibling, bs, n, std::min<int64_t>(predicts.numel(), bs * n),
                   "min(predicts.numel(), bs * num_draft_tokens)");

  // Tokens go into int32 predicts: refuse what a cast would change. All of them, not only
  // the accepted path's, so that every backend refuses the same calls (the wrapper checks
  // the whole tensor before the reference and Triton kernels).
  for (int64_t i = 0; i < bs * n; ++i) {
    TORCH_CHECK(target[i] >= 0 && target[i] <= std::numeric_limits<int32_t>::max(),
                "target_predict must hold token ids (predicts is int32) in [0, 2147483648), got ", target[i],
                " at flat index ", i);
  }

  // Pass 1: the accepted path of every request (nodes) and its tokens, nothing written yet.
  std::vector<int64_t> path(bs * steps), tokens(bs * steps), accepted(bs);
  for (int64_t b = 0; b < bs; ++b) {
    const auto [nt, ns, p, tok] = request_walk(tree, b, path, tokens);
    int64_t num = 0, node = 0;
    for (int64_t level = 1; level < steps; ++level) {
      const int64_t want = target[ridx[b * n + node]];
      int64_t child = nt[node];
      while (child != -1 && cand[b * n + child] != want) {
        child = ns[child];
      }
      if (child == -1) break;
      tok[num] = want;
      p[++num] = node = child;
    }
    tok[num] = target[ridx[b * n + node]];  // the target's token at the last node
    accepted[b] = num;
  }

  write_tree_paths(predicts, accept_index, accept_token_num, tree, path, tokens, accepted);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("verify_tree_greedy", &domino::cpu::verify_tree_greedy_cpu); }
