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
// node's activations, as the rollout's batch), plus n base-logit rows read and, only when
// node_logits is given (or sampling, or past 32 children, where the rows are read back),
// n logits rows of V floats written. At the paper shape in bf16 the stream is w2 (78 MB): a
// 16-node frontier moves about what a batch-1 rollout step moves and does 16x its
// multiply-adds, which from about 8 nodes up are the limit (see domino_head_rollout.cpp
// for the per-ISA rates: ~35 G bf16 multiply-adds/s per core with AVX2; on the 2-core Zen 5
// VM with AVX-512 the 622 M of the paper-shape 16-node step need >= 2.2 ms at the FMA peak,
// and the step takes 4.8-5.0 ms: benchmarks/README.md). With w2 packed (w2_packed:
// AVX512-BF16 CPUs, bf16 weights) the product runs on VDPBF16PS, a rounded to bf16: twice
// the multiply-adds per cycle, so on the 2-core Zen 4 VM the paper-shape 16-node step took
// 5.64 ms against 9.85 ms row-major and a 2.34 ms chain step, while the product alone took
// 1.29-1.36x a chain step (benchmarks/results/tree_step_zen4_session15*.txt). With w_hh
// packed too (w_hh_packed) the GRU's w_hh @ S is the same packed product (S rounded to bf16):
// ~0.5 ms less of float32 FMAs at 16 nodes of the paper shape. Greedy children with m <= 32:
// each vocabulary chunk's best per node, found by a vector skip-scan while the chunk's
// logits are in cache, merged per node (a partial sort past 32 children); sampled, m
// inverse-CDF passes per node, parallel over nodes. On a 2-core Xeon VM with AMX, the
// paper-shape 16-node greedy step without node logits took 3.2-4.6 ms, 1.36-1.71x a chain
// step from run to run, 1.52-1.63x in a normal hour (benchmarks/tree_step_ab.py;
// README.md): by perf, half of it the AMX w2 product waiting on w2's stream (as the chain
// step waits), an eighth the logits tiles (logits_tile), the rest the GRU, the merges and
// the serial parts between parallel regions. Since the AMX product prefetches its next
// panel, the product streams w2 as fast as the chain step does, and the step took 1.30-1.43x
// a chain step on a 2-core Xeon VM with slow memory (thirty-ninth session). The stream still
// stopped while each tile's logits were worked out (~0.5 ms of the step's arithmetic, by
// perf); since the fifty-seventh session the logits epilogue prefetches the next tile's
// first panels meanwhile, and the step took 3.35 -> 3.12 ms (median of 4 alternating
// rounds; 1.24-1.38x a chain step, before 1.26-1.59x; benchmarks/results/
// tree_step_prefetch_xeon_session57.txt).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu/head_math.h"
#include "cpu/isa.h"
#include "cpu/packed_panels.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {

// Greedy order of (value, index) pairs: NaN first (as torch.argmax), then descending, ties
// by index.
inline bool before(float va, int64_t a, float vb, int64_t b) {
  const bool na = va != va, nb = vb != vb;
  if (na || nb) return na && (!nb || a < b);
  return va > vb || (va == vb && a < b);
}

// Orders this thread's non-temporal stores (Kernels::stream_copy) before its later stores,
// the parallel region's join among them.
inline void store_fence() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

constexpr int64_t kScanChildren = 32;  // up to this many children: the skip-scan, else a partial sort

// Whether a step's children come from the per-chunk bests kept while each tile's logits are
// in cache (greedy, at most kScanChildren children), so the logits rows are never read back.
inline bool children_from_chunk_bests(const SamplingParams& sp, int64_t m) {
  return !sp.may_sample() && m <= kScanChildren;
}

// The first m <= kScanChildren tokens of the greedy order among the values offered so far,
// kept sorted with their values (the values offered may be overwritten afterwards: the
// expand step offers each logits tile while it is in L1). Once m are kept a value enters
// only if it beats the m-th, and the vector scan `first_above` skips to the next one above
// it (or NaN), 4L values per test, since almost none qualifies.
struct RunningBest {
  int64_t count;
  float val[kScanChildren];
  int64_t idx[kScanChildren];

  RunningBest() : count(0) {}  // user-provided: a vector of them is not zero-filled first

  // Offers x[0..n) as the tokens offset .. offset + n - 1, which come after every token
  // offered before.
  void offer(const Kernels& K, const float* x, int64_t n, int64_t offset, int64_t m) {
    for (int64_t j = 0; j < n; ++j) {
      if (count == m) {
        // j comes after every kept token, so it enters only if strictly before the m-th:
        // above it, or NaN while the m-th is not (the scan stops at every NaN; the test
        // below keeps the order's rule)
        j = K.first_above(x, j, n, val[m - 1]);
        if (j == n) break;
        const float v = x[j], worst = val[m - 1];
        if (!(v > worst) && !(v != v && worst == worst)) continue;
      }
      int64_t pos = count < m ? count++ : m - 1;
      while (pos > 0 && before(x[j], offset + j, val[pos - 1], idx[pos - 1])) {
        val[pos] = val[pos - 1];
        idx[pos] = idx[pos - 1];
        --pos;
      }
      val[pos] = x[j];
      idx[pos] = offset + j;
    }
  }
};

// The first m tokens of L [V] in the greedy order: the skip-scan for m <= kScanChildren,
// else a partial sort of the indices.
void best_tokens(const Kernels& K, const float* L, int64_t V, int64_t m, std::vector<int64_t>& idx, int64_t* out) {
  if (m > kScanChildren) {
    idx.resize(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(),
                      [L](int64_t a, int64_t b) { return before(L[a], a, L[b], b); });
    std::copy(idx.begin(), idx.begin() + m, out);
    return;
  }
  RunningBest best;
  best.offer(K, L, V, 0, m);
  std::copy(best.idx, best.idx + m, out);
}

// A node's m best tokens (and their logits) from its per-chunk bests (bests[c * stride] for
// each chunk c, the chunks covering the row).
void merge_chunk_bests(const RunningBest* bests, int64_t n_chunks, int64_t stride, int64_t m,
                       std::vector<std::pair<float, int64_t>>& all, int64_t* out, float* values) {
  all.clear();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const RunningBest& b = bests[c * stride];
    for (int64_t i = 0; i < b.count; ++i) all.emplace_back(b.val[i], b.idx[i]);
  }
  std::partial_sort(all.begin(), all.begin() + m, all.end(),
                    [](const auto& x, const auto& y) { return before(x.first, x.second, y.first, y.second); });
  for (int64_t i = 0; i < m; ++i) {
    out[i] = all[i].second;
    values[i] = all[i].first;
  }
}

// log_softmax(L)[x] = (L[x] - max) - log(sum exp(L - max)) for the children x of one node
// (their logits Lx), from the row's merged tile statistics: for the first child exactly the
// rollout's -log(sum); NaN for a row of -inf or holding NaN, as log_softmax.
void greedy_logprobs(const RunningLse& lse, const float* Lx, int64_t m, float* out) {
  const float log_sum = std::log(lse.sum);
  for (int64_t c = 0; c < m; ++c)
    out[c] = lse.max == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::quiet_NaN()
                                                                 : (Lx[c] - lse.max) - log_sum;
}

// A greedy node among sampled ones (its sequence's temperature 0 in a call with per-row
// parameters): its m best tokens, as a greedy call gives them, with log_softmax(L) from one
// pass over the row (as the rollout's greedy rows among sampled ones; the greedy call merges
// per-chunk sums: the same value up to rounding). NaN for a row of -inf or holding NaN.
void greedy_children_of_row(const Kernels& K, const float* L, int64_t V, int64_t m, SampleScratch& s,
                            std::vector<int64_t>& idx, int64_t* tokens, float* logprobs) {
  best_tokens(K, L, V, m, idx, tokens);
  const float top = L[tokens[0]];  // the row's max (NaN first, as the greedy order)
  s.resize(V);
  const float log_sum = std::log(static_cast<float>(K.exp_weights(L, V, top, s.w.data())));
  for (int64_t c = 0; c < m; ++c)
    logprobs[c] = top == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::quiet_NaN()
                                                                  : (L[tokens[c]] - top) - log_sum;
}

// m draws without replacement from the filtered distribution of L (row_sampler.h) under
// sequence seq's parameters, then the best remaining tokens once no mass is left.
void sampled_children(const Kernels& K, const float* L, int64_t V, int64_t m, const SamplingParams& sp,
                      int64_t seq, const double* u, SampleScratch& s, std::vector<int64_t>& idx, int64_t* tokens,
                      float* logprobs) {
  const double total = filtered_row_weights(K, L, V, sp.temperature_at(seq), sp.top_k_at(seq),
                                            static_cast<float>(sp.top_p_at(seq)), s);
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

// Vocabulary rows per product call on the packed path: whole panels of 48. The dot products
// ([n][tile] floats, 74 KB at n = 16) stay in L2; what a tile costs beyond its arithmetic
// (the AMX tile configuration, and per node the logits row's passes, reductions and
// children scan) is paid once per 1152 rows: at 16 nodes of the paper shape the step took
// 3.5-3.9 ms against 4.1-5.2 ms with tiles of 288 rows sized for L1 (2-core Xeon VM with
// AMX, interleaved A/B; benchmarks/README.md).
constexpr int64_t kPackedTile = 24 * kPackedPanelCols;

// a's rows rounded to bf16 (to nearest even, as torch's a.to(torch.bfloat16)) as column
// pairs, zero-padded to an even r and to amx_padded_rows(n) rows: the x operand of
// packed_panels_f32, built once per step.
std::vector<uint32_t> bf16_pairs(const float* act, int64_t n, int64_t r) {
  const int64_t pairs = (r + 1) / 2;
  std::vector<uint32_t> words(amx_padded_rows(n) * pairs, 0u);
  for (int64_t f = 0; f < n; ++f)
    for (int64_t j = 0; j < r; ++j)
      words[f * pairs + j / 2] |= uint32_t{c10::BFloat16(act[f * r + j]).x} << (16 * (j % 2));
  return words;
}

template <typename W, typename BL>
void expand(BL* base, const float* hproj, const float* S, const int64_t* seq, const int64_t* depth,
            const W* gru_input, const W* w_ih, const W* w_hh, const W* w1s, const W* w2,
            const c10::BFloat16* w2_packed, const c10::BFloat16* w_hh_packed, int64_t n, int64_t k, int64_t V, int64_t r, int64_t G, int64_t H,
            int64_t m, const SamplingParams& sp, const double* u, int64_t* tokens, float* logprobs, float* S_child,
            float* L) {
  const Kernels& K = kernels();
  const Gemv<W> gemv{K};
  const int64_t G3 = 3 * G, nc = n * m;
  // scratch every element of which is written before it is read: left uninitialised (gi
  // alone is 0.8 MB for 16 nodes x 4 children at the paper shape)
  const std::unique_ptr<float[]> w1s_out(new float[n * r]), gh(new float[n * G3]), gi(new float[nc * G3]);
  AlignedFloats act(n * r), emb, S_buf, act_buf, emb_buf;  // rows_dot's operands: on a cache line

  // a = silu(hproj[s, d] + S @ w1s^T)
  const float* Sp = gemv.prepare(S, n, G, S_buf);
  correction_input(gemv, w1s, Sp, n, r, G, [&](int64_t f) { return hproj + (seq[f] * k + depth[f]) * r; },
                   w1s_out.get(), act.data());
  // With w2 packed (bf16 weights): the product by AVX512-BF16 dot products, twice the
  // multiply-adds per cycle of the float32 FMAs, on a rounded to bf16 (the reference's
  // F.linear(a.to(w2.dtype), w2) rounds it too; the row-major path keeps it float32).
  const float* ap = w2_packed != nullptr ? nullptr : gemv.prepare(act.data(), n, r, act_buf);
  const std::vector<uint32_t> a_pairs = w2_packed != nullptr ? bf16_pairs(act.data(), n, r) : std::vector<uint32_t>();
  const int64_t pairs = (r + 1) / 2;
  // Chunks of 16 tiles, or on the packed path at least 8 chunks a row (a draft vocabulary of
  // 16K tokens is 15 packed tiles: one chunk of 16 had left every thread but one idle, and
  // the engine drafter's 4-node step took 0.26 ms against 0.165 ms in 8 chunks on the 2-core
  // Xeon VM). Whatever the thread count: the sums are merged per chunk in chunk order, so
  // their bits depend on the chunk size (the row-major path's are the rollout's).
  const int64_t tile = w2_packed != nullptr ? kPackedTile : kVocabTile;
  const int64_t tiles = (V + tile - 1) / tile;
  const int64_t chunk = (w2_packed != nullptr ? std::min<int64_t>(16, (tiles + 7) / 8) : 16) * tile;

  // L = base[s, d] + a @ w2^T, written per node, over vocabulary chunks claimed dynamically
  // (then, with w_hh packed, w_hh @ S's panels: below); greedy: with each chunk's
  // log-sum-exp statistics, merged in chunk order as the rollout's
  const bool greedy = !sp.may_sample();
  const int64_t n_chunks = (V + chunk - 1) / chunk;
  std::vector<RunningLse> partial(greedy ? n_chunks * n : 0);
  // Greedy with few children: each chunk's best tokens per node, offered tile by tile while
  // the tile's logits are in L1 (merged per node below), instead of a second pass over the
  // n rows of V floats; the rows themselves are then only written, with non-temporal stores.
  const bool chunk_bests = children_from_chunk_bests(sp, m);
  std::vector<RunningBest> bests(chunk_bests ? n_chunks * n : 0);
  std::atomic<int64_t> next_chunk{0};
  // With w_hh packed, w_hh @ S (the GRU's hidden gates, gh) is the packed product too (S
  // rounded to bf16, as the reference's F.linear(S.to(w_hh.dtype), w_hh)): at 16 nodes of
  // the paper shape ~0.6 ms of float32 FMAs become one pass over w_hh's 6 MB. It needs
  // neither the logits nor the children, so the threads claim its panels, a few at a time,
  // as they run out of vocabulary chunks: it fills the tail of this region, where one
  // thread waited for the other's last chunk (a mean 0.18 ms of the 4 ms region, 16 nodes
  // of the paper shape, 2-core Zen 4 VM), and saves a region of its own: the same bits, the
  // 16-node step 2-3 % faster at the paper shape and 5-10 % at the engine drafter's head
  // (benchmarks/results/expand_gh_tail_zen4_session63.txt).
  const int64_t s_pairs = (G + 1) / 2;
  const int64_t gh_panels = w_hh_packed != nullptr ? (G3 + kPackedPanelCols - 1) / kPackedPanelCols : 0;
  const std::vector<uint32_t> S_pairs = w_hh_packed != nullptr ? bf16_pairs(S, n, G) : std::vector<uint32_t>();
  constexpr int64_t kGhClaim = 2;  // panels a claim: ~10 us at 16 nodes of the paper shape
  std::atomic<int64_t> next_gh{0};
  // as many threads as there is work for: vocabulary chunks, or claims of w_hh's panels (a
  // vocabulary of one chunk, the row-major path's 4096 tokens, still shares w_hh @ S)
  const int64_t region = std::max(n_chunks, (gh_panels + kGhClaim - 1) / kGhClaim);
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), region), 1, [&](int64_t, int64_t) {
    std::vector<float> dots(n * tile);
    for (int64_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
      const int64_t c_end = std::min(V, (c + 1) * chunk);
      for (int64_t v0 = c * chunk; v0 < c_end; v0 += tile) {
        const int64_t len = std::min(tile, c_end - v0);
        if (w2_packed != nullptr)
          packed_panels_f32(w2_packed, pairs, a_pairs.data(), pairs, n, V, v0 / kPackedPanelCols,
                            (v0 + len + kPackedPanelCols - 1) / kPackedPanelCols, dots.data(), tile);
        else
          gemv.dot(w2 + v0 * r, len, r, ap, n, dots.data(), tile);
        // While the nodes' logits are worked out, the next tile's panels (of this chunk) start
        // coming in: each node's logits_tile prefetches the next share of their lines from
        // the first on, two per vector it works on (len / 4 lines with 16-lane vectors; the
        // product then finds them in L2). Without it the stream waited (top of this file).
        const char* next = nullptr;
        int64_t next_lines = 0, share = 0;
        if (w2_packed != nullptr && v0 + len < c_end) {
          constexpr int64_t kPanelBytes = 2 * kPackedPanelCols * 2;  // per column pair
          next = reinterpret_cast<const char*>(w2_packed) + (v0 + len) / kPackedPanelCols * pairs * kPanelBytes;
          next_lines = (std::min(tile, c_end - v0 - len) + kPackedPanelCols - 1) / kPackedPanelCols * pairs *
                       kPanelBytes / 64;
          share = len / 4;
        }
        for (int64_t f = 0; f < n; ++f) {
          TileStats st;
          float* Lf = dots.data() + f * tile;  // L's tile, in place of the dot products
          const int64_t first = std::min(f * share, next_lines);
          logits_tile(K, Lf, len, base + (seq[f] * k + depth[f]) * V + v0, false,
                      chunk_bests ? nullptr : L + f * V + v0, greedy ? &st : nullptr,
                      next == nullptr ? nullptr : next + 64 * first, std::min(share, next_lines - first));
          if (greedy) partial[c * n + f].merge(st.max, v0 + st.arg, st.sum);
          if (chunk_bests) {
            if (L != nullptr) K.stream_copy(Lf, len, L + f * V + v0);
            bests[c * n + f].offer(K, Lf, len, v0, m);
          }
        }
      }
    }
    for (int64_t p0; (p0 = next_gh.fetch_add(kGhClaim, std::memory_order_relaxed)) < gh_panels;) {
      const int64_t p1 = std::min(gh_panels, p0 + kGhClaim);
      packed_panels_f32(w_hh_packed, s_pairs, S_pairs.data(), s_pairs, n, G3, p0, p1,
                        gh.get() + p0 * kPackedPanelCols, G3);
    }
    store_fence();  // this thread's streamed rows, visible before the join
  });

  // The children of every node
  at::parallel_for(0, n, 1, [&](int64_t f0, int64_t f1) {
    SampleScratch scratch;
    std::vector<int64_t> idx;
    std::vector<std::pair<float, int64_t>> all;
    std::vector<float> Lx(greedy ? m : 0);  // the children's logits
    for (int64_t f = f0; f < f1; ++f) {
      if (greedy) {
        if (chunk_bests) {
          merge_chunk_bests(bests.data() + f, n_chunks, n, m, all, tokens + f * m, Lx.data());
        } else {
          best_tokens(K, L + f * V, V, m, idx, tokens + f * m);
          for (int64_t c = 0; c < m; ++c) Lx[c] = L[f * V + tokens[f * m + c]];
        }
        greedy_logprobs(RunningLse::of_chunks(partial.data() + f, n_chunks, n), Lx.data(), m, logprobs + f * m);
      } else if (sp.temperature_at(seq[f]) == 0.0f) {
        greedy_children_of_row(K, L + f * V, V, m, scratch, idx, tokens + f * m, logprobs + f * m);
      } else {
        sampled_children(K, L + f * V, V, m, sp, seq[f], u + f * m, scratch, idx, tokens + f * m, logprobs + f * m);
      }
    }
  });

  // S_child = GRUCell(E[child], S): w_hh @ S once per node (above with w_hh packed), the
  // input gates per child.
  gru_step(gemv, gru_input, w_ih, w_hh, S, Sp, tokens, n, m, G, H, gi.get(), gh.get(), emb, emb_buf, S_child,
           w_hh_packed != nullptr);
}

// `name` (w2_packed, w_hh_packed): pack_small_batch_linear_weight(w)'s data, for a bf16 weight w
// (`weight`: w2, w_hh) on a CPU with AVX512-BF16.
void check_packed_head_weight(const at::Tensor& packed, const at::Tensor& w, const char* name, const char* weight) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16, name, " needs a bfloat16 ", weight, ", got ", w.scalar_type());
  check_packed_weight(packed, name, w.size(0), w.size(1));
  TORCH_CHECK(small_batch_linear_packed_supported(),
              name, " needs a CPU with AVX2 and FMA, or AVX512-BF16 (and AVX512-BW/VL); this one has neither: pass None");
}

}  // namespace

void domino_head_expand_cpu(const at::Tensor& base_logits, const at::Tensor& hproj,
                            const at::Tensor& node_state, const at::Tensor& node_seq,
                            const at::Tensor& node_depth, const at::Tensor& gru_input,
                            const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                            const at::Tensor& w1s, const at::Tensor& w2, double temperature, int64_t top_k,
                            double top_p, const std::optional<at::Tensor>& uniforms, at::Tensor child_tokens,
                            at::Tensor child_logprobs, at::Tensor child_state,
                            const std::optional<at::Tensor>& node_logits,
                            const std::optional<at::Tensor>& w2_packed,
                            const std::optional<at::Tensor>& w_hh_packed,
                            const std::optional<at::Tensor>& row_temperature,
                            const std::optional<at::Tensor>& row_top_k,
                            const std::optional<at::Tensor>& row_top_p) {
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_head_expand_args(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                         sampling, uniforms, child_tokens, child_logprobs, child_state, node_logits);
  if (w2_packed.has_value()) check_packed_head_weight(*w2_packed, w2, "w2_packed", "w2");
  if (w_hh_packed.has_value()) check_packed_head_weight(*w_hh_packed, w_hh, "w_hh_packed", "w_hh");
  // the packed copies are read while the outputs are written (the op's other inputs are
  // checked with its arguments)
  check_no_overlap({{"child_tokens", &child_tokens}, {"child_logprobs", &child_logprobs},
                    {"child_state", &child_state}, {"node_logits", opt(node_logits)}},
                   {{"w2_packed", opt(w2_packed)}, {"w_hh_packed", opt(w_hh_packed)}});
  const int64_t n = node_state.size(0);
  if (n == 0) return;
  const SamplingParams sp = sampling.params();
  const int64_t k = base_logits.size(1), V = base_logits.size(2);
  const int64_t r = w1s.size(0), G = w1s.size(1), m = child_tokens.size(1);
  const int64_t H = w_ih.has_value() ? w_ih->size(1) : 0;
  const at::Tensor hproj_f = hproj.to(at::kFloat).contiguous();
  const double* u = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;
  // The logits rows: node_logits, or nullptr when the caller does not read them and the
  // children need no second pass over them (greedy, at most kScanChildren children): then
  // they are never written, 4 V bytes a node less of stores (10 MB at 16 nodes of the paper
  // shape, against w2's 78 MB read). Else, without node_logits, a scratch tensor.
  const bool rows_needed = !children_from_chunk_bests(sp, m);
  const at::Tensor rows = node_logits.has_value() ? *node_logits
                          : rows_needed           ? at::empty({n, V}, child_logprobs.options())
                                                  : at::Tensor();
  float* L = rows.defined() ? rows.data_ptr<float>() : nullptr;

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
                          w1s.data_ptr<W>(), w2.data_ptr<W>(),
                          w2_packed.has_value() ? w2_packed->data_ptr<c10::BFloat16>() : nullptr,
                          w_hh_packed.has_value() ? w_hh_packed->data_ptr<c10::BFloat16>() : nullptr, n, k, V, r, G, H,
                          m, sp, u,
                          child_tokens.data_ptr<int64_t>(), child_logprobs.data_ptr<float>(),
                          child_state.data_ptr<float>(), L);
          }
        }));
    }));
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("domino_head_expand", &domino::cpu::domino_head_expand_cpu); }
