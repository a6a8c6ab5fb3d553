// CPU kernel of sample: one token per row of logits [b, V].
//
// Bytes: greedy reads each row once (b*V logits). Sampling reads it once, then works on
// the tempered copy z (4 B per token) and the weights w (8 B per token), plus
// nth_element when top_k > 0 and, when top_p < 1, a sort of the tokens that can be in the
// nucleus (see row_sampler.h).
//
// Greedy: the instruction-set build's argmax (argmax.h), bound by the read bandwidth of
// one core per row (16-20 GB/s on the AVX2 EPYC VM); rows in parallel.
// Sampling: each row with its own parameters (sampling_params.h; a row at temperature 0
// is the argmax); rows in parallel, one thread per row; the tempering, max and double
// exponentials are vectorised, the CDF scan is one dependent double add per token up to
// the sampled one (the limit at batch 1, with top_k's nth_element and top_p's sort).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "cpu/argmax.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {

template <typename T>
void sample_rows(const Kernels& K, const T* x, int64_t b, int64_t V, const SamplingParams& sp,
                 const double* u, int64_t* out) {
  if (!sp.may_sample()) {
    if (b < at::get_num_threads()) {
      for (int64_t s = 0; s < b; ++s) out[s] = row_argmax(K, x + s * V, V, /*split=*/true);
      return;
    }
    at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) out[s] = argmax_span(K, x + s * V, V).index;
    });
    return;
  }
  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    SampleScratch scratch;
    for (int64_t s = s0; s < s1; ++s) {
      const float t = sp.temperature_at(s);
      out[s] = t == 0.0f ? argmax_span(K, x + s * V, V).index
                         : sample_row(K, x + s * V, V, t, sp.top_k_at(s), static_cast<float>(sp.top_p_at(s)),
                                      u[s], scratch).token;
    }
  });
}

}  // namespace

void sample_cpu(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                const std::optional<at::Tensor>& uniforms, at::Tensor tokens,
                const std::optional<at::Tensor>& row_temperature,
                const std::optional<at::Tensor>& row_top_k,
                const std::optional<at::Tensor>& row_top_p) {
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_sample_args(logits, sampling, uniforms, tokens);
  const Kernels& K = kernels();
  const SamplingParams sp = sampling.params();
  const int64_t b = logits.size(0), V = logits.size(1);
  const double* u = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;
  int64_t* out = tokens.data_ptr<int64_t>();
  if (logits.scalar_type() == at::kBFloat16)
    sample_rows(K, logits.data_ptr<c10::BFloat16>(), b, V, sp, u, out);
  else
    sample_rows(K, logits.data_ptr<float>(), b, V, sp, u, out);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("sample", &domino::cpu::sample_cpu); }
