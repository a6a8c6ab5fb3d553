// CPU kernel of filtered_probs: the distribution `sample` draws from, one row of logits
// [b, V] at a time, written as float32 probabilities [b, V] (the p and q of
// verify_sampling and of the tree samplers).
//
// Bytes: each row's logits are read once (V * 4 B fp32, V * 2 B bf16) and its
// probabilities written once (V * 4 B); in between the row sampler's scratch (row_sampler.h:
// the tempered copy z, 4 B a token, and the float64 weights w, 8 B a token) stays in L2 for
// the vocabularies of today's models (V = 49152: 0.6 MB). At temperature 0 a row is the
// argmax's one-hot: one read, one write.
//
// Limits: the double exponentials (vectorised, isa.h) and the division of each weight by
// the row's total (the reference's rounding: w / total in float64, then float32) bound a
// row at ~10-20 us on one AVX2 core (V = 49152); top_k adds the bucketed nth_element and
// top_p < 1 the sort of the nucleus candidates. Rows run in parallel, one thread a row: a
// verification's few rows take at most ceil(rows / threads) row times.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "cpu/argmax.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {

// One row's probabilities: the one-hot of the argmax at temperature 0, else the filtered
// weights over their total.
template <typename T>
void filtered_probs_row(const Kernels& K, const T* x, int64_t V, float temperature, int64_t top_k, float top_p,
                        float* out, SampleScratch& scratch) {
  if (temperature == 0.0f) {
    std::fill(out, out + V, 0.0f);
    out[argmax_span(K, x, V).index] = 1.0f;
    return;
  }
  const double total = filtered_row_weights(K, x, V, temperature, top_k, top_p, scratch);
  const double* w = scratch.w.data();
  for (int64_t j = 0; j < V; ++j) out[j] = static_cast<float>(w[j] / total);
}

template <typename T>
void filtered_probs_rows(const Kernels& K, const T* x, int64_t b, int64_t V, const SamplingParams& sp, float* out) {
  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    SampleScratch scratch;
    for (int64_t s = s0; s < s1; ++s)
      filtered_probs_row(K, x + s * V, V, sp.temperature_at(s), sp.top_k_at(s), static_cast<float>(sp.top_p_at(s)),
                         out + s * V, scratch);
  });
}

}  // namespace

void filtered_probs_cpu(const at::Tensor& logits, double temperature, int64_t top_k, double top_p, at::Tensor probs,
                        const std::optional<at::Tensor>& row_temperature, const std::optional<at::Tensor>& row_top_k,
                        const std::optional<at::Tensor>& row_top_p) {
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_filtered_probs_args(logits, sampling, probs);
  const Kernels& K = kernels();
  const SamplingParams sp = sampling.params();
  const int64_t b = logits.size(0), V = logits.size(1);
  float* out = probs.data_ptr<float>();
  if (logits.scalar_type() == at::kBFloat16)
    filtered_probs_rows(K, logits.data_ptr<c10::BFloat16>(), b, V, sp, out);
  else
    filtered_probs_rows(K, logits.data_ptr<float>(), b, V, sp, out);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("filtered_probs", &domino::cpu::filtered_probs_cpu); }
