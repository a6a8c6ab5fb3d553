// CPU kernel of sample: one token per row of logits [b, V].
//
// Bytes: greedy reads each row once (b*V logits). Sampling reads it once, then works on
// the tempered copy z (4 B per token) and the weights w (8 B per token), plus
// nth_element when top_k > 0 and, when top_p < 1, a sort of the tokens that can be in the
// nucleus (see row_sampler.h).
//
// Greedy: the instruction-set build's argmax (argmax.h), bound by the read bandwidth of
// one core per row (16-20 GB/s on the AVX2 EPYC VM); rows in parallel.
// Sampling: rows in parallel, one thread per row; the tempering, max and double
// exponentials are vectorised, the CDF scan is one dependent double add per token up to
// the sampled one (the limit at batch 1, with top_k's nth_element and top_p's sort).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/argmax.h"
#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {
namespace {

template <typename T>
void sample_rows(const Kernels& K, const T* x, int64_t b, int64_t V, double temperature,
                 int64_t top_k, double top_p, const std::optional<at::Tensor>& uniforms,
                 int64_t* out) {
  if (temperature == 0.0) {
    if (b < at::get_num_threads()) {
      for (int64_t s = 0; s < b; ++s) out[s] = row_argmax(K, x + s * V, V, /*split=*/true);
      return;
    }
    at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) out[s] = argmax_span(K, x + s * V, V).index;
    });
    return;
  }
  const double* u = uniforms->data_ptr<double>();
  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    SampleScratch scratch;
    for (int64_t s = s0; s < s1; ++s)
      out[s] = sample_row(K, x + s * V, V, static_cast<float>(temperature), top_k,
                          static_cast<float>(top_p), u[s], scratch).token;
  });
}

}  // namespace

void sample_cpu(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                const std::optional<at::Tensor>& uniforms, at::Tensor tokens) {
  check_sample_args(logits, temperature, top_k, top_p, uniforms, tokens);
  const Kernels& K = kernels();
  const int64_t b = logits.size(0), V = logits.size(1);
  int64_t* out = tokens.data_ptr<int64_t>();
  if (logits.scalar_type() == at::kBFloat16)
    sample_rows(K, logits.data_ptr<c10::BFloat16>(), b, V, temperature, top_k, top_p, uniforms, out);
  else
    sample_rows(K, logits.data_ptr<float>(), b, V, temperature, top_k, top_p, uniforms, out);
}

}  // namespace domino::cpu
