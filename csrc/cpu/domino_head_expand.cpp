// CPU kernel of domino_head_expand: one step of Domino tree drafting over a frontier.
//
// Each of the n frontier nodes belongs to a sequence s and sits at a depth d; it carries its
// own GRU state S. For every node, with hproj and base logits shared by the nodes of a
// sequence at one depth:
//   a = silu(hproj[s, d] + w1s @ S)                 w1s [r, G]
//   L = base_logits[s, d] + w2 @ a                  w2  [V, r]     (written to node_logits)
//   children: the m best tokens of L (T = 0: descending, NaN first, ties by index) or m
//             draws without replacement from softmax(filter(L / T)) (inverse CDF at the
//             node's m uniforms; once the mass is used up, the best remaining tokens with
//             log-probability -inf), each with its log-probability (log_softmax(L) at T = 0,
//             the filtered distribution at T > 0)
//   S_child = GRUCell(E[child], S)                  w_hh [3G, G] once per node, the input
//                                                   gates per child (table rows or w_ih @ E)
// Bytes per step: w2 (V*r), w1s (r*G), w_hh (3G*G) and w_ih (3G*H) or n*m table rows, each
// weight streamed once for the whole frontier (Gemv: a loaded weight row meets every
// node's activations, as the rollout's batch), plus n base-logit rows read and n logits
// rows of V floats written. At the paper shape in bf16 the stream is w2 (78 MB): a
// 16-node frontier moves about what a batch-1 rollout step moves and does 16x its
// multiply-adds, which from about 8 nodes up are the limit (see domino_head_rollout.cpp
// for the per-ISA rates: ~35 G bf16 multiply-adds/s per core with AVX2; on the 2-core Zen 5
// VM with AVX-512 the 622 M of the paper-shape 16-node step need >= 2.2 ms at the FMA peak,
// and the step takes 4.8-5.0 ms: benchmarks/README.md). The children's selection is per
// node, parallel over nodes: greedy, a vector skip-scan for the top m <= 32 (a partial
// sort past that); sampled, m inverse-CDF passes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cpu/head_math.h"
#include "cpu/isa.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {

// Greedy order: NaN first (as torch.argmax), then descending, ties by index.
inline bool before(const float* L, int64_t a, int64_t b) {
  const bool na = L[a] != L[a], nb = L[b] != L[b];
  if (na || nb) return na && (!nb || a < b);
  return L[a] > L[b] || (L[a] == L[b] && a < b);
}

// The first m tokens of the greedy order. For small m one pass keeps them sorted in
// `out`: once m are kept, a token enters only if it beats the current m-th, and the vector
// scan `first_above` skips to the next token above it (or NaN), 4L tokens per test, since
// almost none qualifies; for large m a partial sort of the indices.
void best_tokens(const Kernels& K, const float* L, int64_t V, int64_t m, std::vector<int64_t>& idx, int64_t* out) {
  if (m > 32) {
    idx.resize(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), [L](int64_t a, int64_t b) { return before(L, a, b); });
    std::copy(idx.begin(), idx.begin() + m, out);
    return;
  }
  int64_t count = 0;
  for (int64_t j = 0; j < V; ++j) {
    if (count == m) {
      // j comes after every kept index, so it enters only if strictly before the m-th:
      // above it, or NaN while the m-th is not (the scan stops at every NaN; the test below
      // keeps the order's rule)
      j = K.first_above(L, j, V, L[out[m - 1]]);
      if (j == V) break;
      const float x = L[j], worst = L[out[m - 1]];
      if (!(x > worst) && !(x != x && worst == worst)) continue;
    }
    int64_t pos = count < m ? count++ : m - 1;
    while (pos > 0 && before(L, j, out[pos - 1])) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = j;
  }
}

// log_softmax(L)[x] = (L[x] - max) - log(sum exp(L - max)) for the children x of one node,
// from the row's merged tile statistics: for the first child exactly the rollout's
// -log(sum); NaN for a row of -inf or holding NaN, as log_softmax.
void greedy_logprobs(const RunningLse& lse, const float* L, const int64_t* x, int64_t m, float* out) {
  const float log_sum = std::log(lse.sum);
  for (int64_t c = 0; c < m; ++c)
    out[c] = lse.max == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::quiet_NaN()
                                                                 : (L[x[c]] - lse.max) - log_sum;
}

// m draws without replacement from the filtered distribution of L (row_sampler.h), then
// the best remaining tokens once no mass is left.
void sampled_children(const Kernels& K, const float* L, int64_t V, int64_t m, const SamplingParams& sp,
                      const double* u, SampleScratch& s, std::vector<int64_t>& idx, int64_t* tokens,
                      float* logprobs) {
  const double total = filtered_row_weights(K, L, V, sp.temperature_at(0), sp.top_k_at(0),
                                            static_cast<float>(sp.top_p_at(0)), s);
  std::vector<double>& w = s.w;
  int64_t c = 0;
  for (; c < m; ++c) {
    double left = 0.0;
    for (int64_t j = 0; j < V; ++j) left += w[j];  // index order, as the reference's cumsum
    if (!(left > 0.0)) break;
    const int64_t x = inverse_cdf(w.data(), V, left, u[c]);
    tokens[c] = x;
    logprobs[c] = static_cast<float>(std::log(w[x]) - std::log(total));
    w[x] = 0.0;
  }
  if (c == m) return;
  // No mass left: the best tokens by L not drawn yet, all among the m best (c < m are drawn).
  std::vector<int64_t> best(m);
  best_tokens(K, L, V, m, idx, best.data());
  for (int64_t j = 0; c < m; ++j) {
    if (std::find(tokens, tokens + c, best[j]) != tokens + c) continue;
    tokens[c] = best[j];
    logprobs[c++] = -std::numeric_limits<float>::infinity();
  }
}

template <typename W, typename BL>
void expand(BL* base, const float* hproj, const float* S, const int64_t* seq, const int64_t* depth,
            const W* gru_input, const W* w_ih, const W* w_hh, const W* w1s, const W* w2, int64_t n, int64_t k,
            int64_t V, int64_t r, int64_t G, int64_t H, int64_t m, const SamplingParams& sp, const double* u,
            int64_t* tokens, float* logprobs, float* S_child, float* L) {
  const Kernels& K = kernels();
  const Gemv<W> gemv{K};
  const int64_t G3 = 3 * G, nc = n * m;
  std::vector<float> w1s_out(n * r), gh(n * G3), gi(nc * G3);
  AlignedFloats act(n * r), emb, S_buf, act_buf, emb_buf;  // rows_dot's operands: on a cache line

  // a = silu(hproj[s, d] + S @ w1s^T)
  const float* Sp = gemv.prepare(S, n, G, S_buf);
  correction_input(gemv, w1s, Sp, n, r, G, [&](int64_t f) { return hproj + (seq[f] * k + depth[f]) * r; },
                   w1s_out.data(), act.data());
  const float* ap = gemv.prepare(act.data(), n, r, act_buf);

  // L = base[s, d] + a @ w2^T, written per node, over vocabulary chunks claimed dynamically;
  // greedy: with each chunk's log-sum-exp statistics, merged in chunk order as the rollout's
  const bool greedy = !sp.may_sample();
  const int64_t n_chunks = (V + kVocabChunk - 1) / kVocabChunk;
  std::vector<RunningLse> partial(greedy ? n_chunks * n : 0);
  std::atomic<int64_t> next_chunk{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n_chunks), 1, [&](int64_t, int64_t) {
    std::vector<float> dots(n * kVocabTile);
    for (int64_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
      const int64_t c_end = std::min(V, (c + 1) * kVocabChunk);
      for (int64_t v0 = c * kVocabChunk; v0 < c_end; v0 += kVocabTile) {
        const int64_t len = std::min(kVocabTile, c_end - v0);
        gemv.dot(w2 + v0 * r, len, r, ap, n, dots.data(), kVocabTile);
        for (int64_t f = 0; f < n; ++f) {
          TileStats st;
          logits_tile(K, dots.data() + f * kVocabTile, len, base + (seq[f] * k + depth[f]) * V + v0, false,
                      L + f * V + v0, greedy ? &st : nullptr);
          if (greedy) partial[c * n + f].merge(st.max, v0 + st.arg, st.sum);
        }
      }
    }
  });

  // The children of every node
  at::parallel_for(0, n, 1, [&](int64_t f0, int64_t f1) {
    SampleScratch scratch;
    std::vector<int64_t> idx;
    for (int64_t f = f0; f < f1; ++f) {
      if (greedy) {
        best_tokens(K, L + f * V, V, m, idx, tokens + f * m);
        greedy_logprobs(RunningLse::of_chunks(partial.data() + f, n_chunks, n), L + f * V, tokens + f * m, m,
                        logprobs + f * m);
      } else {
        sampled_children(K, L + f * V, V, m, sp, u + f * m, scratch, idx, tokens + f * m, logprobs + f * m);
      }
    }
  });

  // S_child = GRUCell(E[child], S): w_hh @ S once per node, the input gates per child.
  gru_step(gemv, gru_input, w_ih, w_hh, S, Sp, tokens, n, m, G, H, gi.data(), gh.data(), emb, emb_buf, S_child);
}

}  // namespace

void domino_head_expand_cpu(const at::Tensor& base_logits, const at::Tensor& hproj,
                            const at::Tensor& node_state, const at::Tensor& node_seq,
                            const at::Tensor& node_depth, const at::Tensor& gru_input,
                            const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                            const at::Tensor& w1s, const at::Tensor& w2, double temperature, int64_t top_k,
                            double top_p, const std::optional<at::Tensor>& uniforms, at::Tensor child_tokens,
                            at::Tensor child_logprobs, at::Tensor child_state, at::Tensor node_logits) {
  const std::optional<at::Tensor> none;
  const SamplingArgs sampling{temperature, top_k, top_p, none, none, none};
  check_head_expand_args(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                         sampling, uniforms, child_tokens, child_logprobs, child_state, node_logits);
  const int64_t n = node_state.size(0);
  if (n == 0) return;
  const SamplingParams sp = sampling.params();
  const int64_t k = base_logits.size(1), V = base_logits.size(2);
  const int64_t r = w1s.size(0), G = w1s.size(1), m = child_tokens.size(1);
  const int64_t H = w_ih.has_value() ? w_ih->size(1) : 0;
  const at::Tensor hproj_f = hproj.to(at::kFloat).contiguous();
  const double* u = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;

  AT_DISPATCH_SWITCH(w2.scalar_type(), "domino_head_expand_cpu",
    AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
      using W = scalar_t;
      AT_DISPATCH_SWITCH(base_logits.scalar_type(), "domino_head_expand_cpu_base",
        AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
          using BL = scalar_t;
          if constexpr (std::is_same_v<W, double> || std::is_same_v<BL, double>) {
            TORCH_CHECK(false, "domino_head_expand: float64 is not supported");
          } else {
            expand<W, BL>(base_logits.data_ptr<BL>(), hproj_f.data_ptr<float>(), node_state.data_ptr<float>(),
                          node_seq.data_ptr<int64_t>(), node_depth.data_ptr<int64_t>(), gru_input.data_ptr<W>(),
                          w_ih.has_value() ? w_ih->data_ptr<W>() : nullptr, w_hh.data_ptr<W>(),
                          w1s.data_ptr<W>(), w2.data_ptr<W>(), n, k, V, r, G, H, m, sp, u,
                          child_tokens.data_ptr<int64_t>(), child_logprobs.data_ptr<float>(),
                          child_state.data_ptr<float>(), node_logits.data_ptr<float>());
          }
        }));
    }));
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("domino_head_expand", &domino::cpu::domino_head_expand_cpu); }
