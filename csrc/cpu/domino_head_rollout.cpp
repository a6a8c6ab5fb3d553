// CPU kernel of domino_head_rollout: k sequential steps of the Domino head.
//
// Per step i, for every sequence of the batch:
//   a   = silu(hproj[:, i] + w1s @ S)                      w1s   [r, G]
//   L   = base_logits[:, i] + w2 @ a                       w2    [V, r]
//   x_i = argmax(L) or a sample of softmax(filter(L / T))
//   S   = GRUCell(E[x_i], S)                               w_hh  [3G, G], w_ih [3G, H] or table [V, 3G]
//
// Bytes per step (the floor): w2 (V*r), w_hh (3G*G), w1s (r*G), w_ih (3G*H) or b table rows
// (b*3G), one base-logit row per sequence (b*V). At the paper shape in bf16 that is ~85 MB
// per step with the table, dominated by w2 (78 MB). Every weight is streamed once per step
// for the whole batch (rows_dot multiplies a loaded weight row into up to 8 activations),
// so batch 8 moves little more memory than batch 1 but does 8x the multiply-adds.
//
// Every per-element loop (dot products, logits tiles, silu, GRU gates) runs on the
// instruction-set build chosen at run time (isa.h: avx512, avx2, sse2; DOMINO_CPU_ISA).
// What limits each, at the paper shape (numbers: one core of the 2-core AMD EPYC (Zen 3)
// VM, AVX2+FMA, thread CPU time of rows_dot over w2; a plain read loop streams 17-22 GB/s
// per core there):
//   batch 1, the w2 stream. A block of kAcc rows is read row by row, each start to end,
//     with two FMA chains per row; bf16 is widened in registers (shift / and of 32-bit
//     words, activations pre-permuted to match).
//     avx2:   16 GB/s of bf16 weights from DRAM per core (41 GB/s when the rows are in
//             L1), 18 GB/s of fp32: bound by DRAM bandwidth.
//     sse2:   12.6 GB/s bf16 (19 from L1: no FMA, 4 lanes), 17 fp32: bf16 is nearly
//             compute bound on one core, DRAM bound with two.
//     avx512: 16 accumulators in 32 zmm registers, 32 bf16 columns per step. On a Zen 5
//             EPYC VM (2 cores): 32 GB/s of bf16 per core from DRAM with the software
//             prefetch (vec.h kPrefetchBytes), 20 GB/s without; the avx2 build there
//             reaches 35 GB/s: DRAM bound either way.
//   batch 8, the multiply-adds (8 x V x r per step). Rows outer with 16 registers (2 rows
//     x 4 activations, activations from L1): avx2 35 G bf16 multiply-adds/s per core (38
//     from L1), 22 G fp32; sse2 15 / 16 G. With 32 (avx512) the activations stay in
//     registers against 4 rows read side by side, two activations at a time, one fold of
//     16 sums per 8 rows x 2, and each pass prefetches the next L1 chunk (vec.h
//     dot_block, kInterleave): the paper-shape 16-node tree step 5.5-5.75 -> 4.8-5.0 ms.
//   Rows interleaved step by step measured 35-50 % slower from DRAM than rows read one
//   after the other (the hardware prefetchers), at 2 rows as at 8. Software prefetch 4 KB
//   ahead (past the page the hardware prefetchers stop at) measured no gain on the AVX2
//   machine but 1.3x per step at batch 1 on the Zen 5 VM (bench_head.py, paper shape,
//   bf16: 32.4 -> 24.8 ms per 15-step rollout); activation buffers on a cache line
//   (cpu/aligned.h) made batch 2-8 1.6-1.7x faster there. At batch 8 and up
//   the fp32 multiply-adds are the limit: ~80 G/s on two Zen 5 cores before the
//   interleaved blocks (29 % of their FMA peak, 2 x 8.7 G 16-lane FMAs/s measured), ~130
//   G/s in the 16-node tree step after. exp for the greedy log-sum-exp: one vector exp per
//   logit.
// Threading: up to three parallel phases per step. (1) rows of w1s and a (one thread when
// w1s is under 1 MB, as at both shapes of the benchmark); (2) the vocabulary in
// chunks of kVocabChunk rows that threads claim dynamically, so a thread slowed by another
// process takes fewer (partials merged in chunk order: the result does not depend on the
// schedule); (3) the GRU, each thread owning a range of hidden units for all three gates.
// At the small shape (w2 6.3 MB, in the last-level cache) the two fork/joins per step are
// a visible share of the ~0.2 ms step; on a machine shared with other processes each can
// wait a scheduler slice (measured 4-16 ms on the 2-core VM) for its second thread.
//
// Greedy (T = 0) never materialises logits: per chunk and sequence the running
// max/argmax and the sum of exp(L - max) (log-sum-exp with rescaling), merged at the end of
// the step. Sampling (T > 0) needs the filtered distribution, so L is written once into
// one [b, V] float row that the sampler reads (row_sampler.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/argmax.h"
#include "cpu/head_math.h"
#include "cpu/isa.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {


template <typename W, typename BL>
void rollout(BL* base, const float* hproj, float* S, const W* gru_input, const W* w_ih,
             const W* w_hh, const W* w1s, const W* w2, int64_t b, int64_t k, int64_t V,
             int64_t r, int64_t G, int64_t H, const SamplingParams& sp,
             const double* uniforms, bool write_logits, int64_t* tokens, float* logprobs) {
  const Kernels& K = kernels();
  const Gemv<W> gemv{K};
  // Every row greedy: the logits are reduced tile by tile and never stored. Otherwise
  // each row is written out and chosen by its own parameters.
  const bool greedy = !sp.may_sample();
  const int64_t G3 = 3 * G;
  // Activations are [b][n] throughout; rows_dot writes y[s * ys + row].
  std::vector<float> w1s_out(b * r), gi(b * G3), gh(b * G3);
  AlignedFloats act(b * r), S_new(b * G), emb;  // rows_dot's operands: on a cache line
  AlignedFloats S_buf, act_buf, emb_buf;        // activations in rows_dot's layout
  std::vector<float> row;  // the one [b, V] logits row, only when sampling
  if (!greedy) row.resize(b * V);

  const int64_t n_chunks = (V + kVocabChunk - 1) / kVocabChunk;
  std::vector<RunningLse> partial(n_chunks * b);
  std::vector<int64_t> x(b);
  std::vector<SampleScratch> scratch(b);
  const int64_t threads = at::get_num_threads();

  for (int64_t i = 0; i < k; ++i) {
    // a = silu(hproj[:, i] + S @ w1s^T), rows of w1s split across threads
    const float* Sp = gemv.prepare(S, b, G, S_buf);
    correction_input(gemv, w1s, Sp, b, r, G, [&](int64_t s) { return hproj + (s * k + i) * r; }, w1s_out.data(),
                     act.data());
    const float* ap = gemv.prepare(act.data(), b, r, act_buf);

    // L = base + a @ w2^T over vocabulary tiles; reduce (greedy) or write the row.
    std::atomic<int64_t> next_chunk{0};
    at::parallel_for(0, std::min(threads, n_chunks), 1, [&](int64_t, int64_t) {
      std::vector<float> dots(b * kVocabTile);
      for (int64_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
        RunningLse* part = partial.data() + c * b;
        for (int64_t s = 0; s < b; ++s) part[s] = RunningLse{};
        const int64_t c_end = std::min(V, (c + 1) * kVocabChunk);
        for (int64_t v0 = c * kVocabChunk; v0 < c_end; v0 += kVocabTile) {
          const int64_t n = std::min(kVocabTile, c_end - v0);
          gemv.dot(w2 + v0 * r, n, r, ap, b, dots.data(), kVocabTile);
          for (int64_t s = 0; s < b; ++s) {
            TileStats st;
            logits_tile(K, dots.data() + s * kVocabTile, n, base + (s * k + i) * V + v0, write_logits,
                        greedy ? nullptr : row.data() + s * V + v0, greedy ? &st : nullptr);
            if (greedy) part[s].merge(st.max, v0 + st.arg, st.sum);
          }
        }
      }
    });

    // Choose the token of every sequence.
    if (greedy) {
      for (int64_t s = 0; s < b; ++s) {
        const RunningLse total = RunningLse::of_chunks(partial.data() + s, n_chunks, b);
        x[s] = total.arg;
        // L[x] - lse with L[x] = max; NaN for a row of -inf, as log_softmax
        logprobs[s * k + i] = total.max == -std::numeric_limits<float>::infinity()
                                  ? std::numeric_limits<float>::quiet_NaN()
                                  : -std::log(total.sum);
      }
    } else {
      at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          const float* L = row.data() + s * V;
          const float t = sp.temperature_at(s);
          Sampled got;
          if (t == 0.0f) {  // a greedy row among sampled ones: argmax, log-prob under softmax(L)
            got.token = argmax_span(K, L, V).index;
            scratch[s].resize(V);
            got.logprob = static_cast<float>(-std::log(K.exp_weights(L, V, L[got.token], scratch[s].w.data())));
          } else {
            got = sample_row(K, L, V, t, sp.top_k_at(s), static_cast<float>(sp.top_p_at(s)),
                             uniforms[s * k + i], scratch[s]);
          }
          x[s] = got.token;
          logprobs[s * k + i] = got.logprob;
        }
      });
    }
    for (int64_t s = 0; s < b; ++s) tokens[s * k + i] = x[s];

    // S = GRUCell(E[x], S)
    gru_step(gemv, gru_input, w_ih, w_hh, S, Sp, x.data(), b, 1, G, H, gi.data(), gh.data(), emb, emb_buf,
             S_new.data());
    std::copy(S_new.begin(), S_new.end(), S);
  }
}

}  // namespace

void domino_head_rollout_cpu(at::Tensor base_logits, const at::Tensor& hproj,
                             const at::Tensor& state, const at::Tensor& gru_input,
                             const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                             const at::Tensor& w1s, const at::Tensor& w2, double temperature,
                             int64_t top_k, double top_p,
                             const std::optional<at::Tensor>& uniforms, bool write_logits,
                             at::Tensor tokens, at::Tensor logprobs, at::Tensor state_out,
                             const std::optional<at::Tensor>& row_temperature,
                             const std::optional<at::Tensor>& row_top_k,
                             const std::optional<at::Tensor>& row_top_p) {
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_head_rollout_args(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, sampling, uniforms,
                          tokens, logprobs, state_out);
  const SamplingParams sp = sampling.params();
  const int64_t b = base_logits.size(0), k = base_logits.size(1), V = base_logits.size(2);
  const int64_t r = w1s.size(0), G = w1s.size(1);
  const int64_t H = w_ih.has_value() ? w_ih->size(1) : 0;
  state_out.copy_(state);
  const at::Tensor hproj_f = hproj.to(at::kFloat).contiguous();
  const double* u = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;

  AT_DISPATCH_SWITCH(w2.scalar_type(), "domino_head_rollout_cpu",
    AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
      using W = scalar_t;
      AT_DISPATCH_SWITCH(base_logits.scalar_type(), "domino_head_rollout_cpu_base",
        AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
          using BL = scalar_t;
          if constexpr (std::is_same_v<W, double> || std::is_same_v<BL, double>) {
            TORCH_CHECK(false, "domino_head_rollout: float64 is not supported");
          } else {
            rollout<W, BL>(base_logits.data_ptr<BL>(), hproj_f.data_ptr<float>(),
                           state_out.data_ptr<float>(), gru_input.data_ptr<W>(),
                           w_ih.has_value() ? w_ih->data_ptr<W>() : nullptr,
                           w_hh.data_ptr<W>(), w1s.data_ptr<W>(), w2.data_ptr<W>(), b, k, V,
                           r, G, H, sp, u, write_logits,
                           tokens.data_ptr<int64_t>(), logprobs.data_ptr<float>());
          }
        }));
    }));
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("domino_head_rollout", &domino::cpu::domino_head_rollout_cpu); }
