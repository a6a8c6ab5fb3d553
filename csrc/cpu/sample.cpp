// CPU kernel of sample: one token per row of logits [b, V].
//
// Greedy reads each row once (argmax, first index on ties, as torch.argmax). Sampling
// tempers, filters (top-k by nth_element, top-p by a sort of the survivors) and inverts
// the CDF with the caller's uniform; see row_sampler.h for the exact semantics. Rows run in
// parallel; the cost is one pass over b*V logits plus the sort when top_p < 1.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {

void sample_cpu(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                const std::optional<at::Tensor>& uniforms, at::Tensor tokens) {
  check_sample_args(logits, temperature, top_k, top_p, uniforms, tokens);
  const int64_t b = logits.size(0), V = logits.size(1);
  int64_t* out = tokens.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "sample_cpu", [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    if (temperature == 0.0) {
      at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) out[s] = argmax_row(x + s * V, V);
      });
      return;
    }
    const double* u = uniforms->data_ptr<double>();
    at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
      SampleScratch scratch;
      std::vector<float> row(V);
      for (int64_t s = s0; s < s1; ++s) {
        for (int64_t j = 0; j < V; ++j) row[j] = static_cast<float>(x[s * V + j]);
        out[s] = sample_row(row.data(), V, static_cast<float>(temperature), top_k,
                            static_cast<float>(top_p), u[s], scratch).token;
      }
    });
  });
}

}  // namespace domino::cpu
